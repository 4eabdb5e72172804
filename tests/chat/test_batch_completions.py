"""`/v1/completions` lines in a batch file, through the `llava_chat` pipeline on the embedded tiny LLaVA:
a list of prompts x n as indexed choices, echo with logprobs equal to transformers' scores of the same
tokens, `logprobs: 0`, a token-id prompt, structured output, and a chat line in the same file.
(tests/serving/test_choices.py checks the same bodies against `appliance serve`'s answers.)"""
import json

import pytest
import torch

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.chat.conftest import batch_request, completion_request, write_jsonl
from tests.chat.test_cli_e2e import LLAVA_TINY, llava_tiny
from tests.conftest import assert_user_error, run_cli

pytestmark = llava_tiny
PROMPTS = ["The shape is", "What color is"]
LINES = [
    completion_request("list", PROMPTS, n=2, max_tokens=5, temperature=0),
    *(completion_request(f"alone{i}", prompt, max_tokens=5, temperature=0) for i, prompt in enumerate(PROMPTS)),
    batch_request("chat", "Hi", max_tokens=4),
    completion_request("echo", "The shape is", echo=True, logprobs=1, max_tokens=4, temperature=0),
    completion_request("zero", "The shape is", logprobs=0, max_tokens=4, temperature=0),
    completion_request("ids", [1, 50, 60, 70], echo=True, max_tokens=3),
    completion_request("choice", "Is the shape red?", structured_outputs={"choice": ["yes", "no"]}, max_tokens=5),
]


@pytest.fixture(scope="module")
def bodies(tmp_path_factory):
    """{custom_id: response body} of one batch run over LINES."""
    root = tmp_path_factory.mktemp("completions")
    output = root / "answers.jsonl"
    pipeline = build_pipeline(compose(["pipeline=llava_chat", "engine.dtype=float32"]))
    try:
        (done,) = pipeline.run([{"input": str(write_jsonl(root / "requests.jsonl", LINES)), "output": str(output),
                                 "prompt": None}])
    finally:
        pipeline.close()
    assert done["display"] == f"wrote {len(LINES)} answers to {output}"
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [line["custom_id"] for line in LINES], "input order"
    return {line["custom_id"]: line["response"]["body"] for line in lines}


def test_a_prompt_list_times_n_gives_choices_indexed_as_vllm(bodies):
    body, alone = bodies["list"], [bodies["alone0"], bodies["alone1"]]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [alone[0]["choices"][0]["text"]] * 2 + \
        [alone[1]["choices"][0]["text"]] * 2
    assert body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone), "each prompt once"
    assert body["usage"]["completion_tokens"] == 2 * sum(a["usage"]["completion_tokens"] for a in alone)
    assert bodies["chat"]["object"] == "chat.completion", "a chat line in the same file stays a chat"


def _transformers_greedy(prompt_ids, steps):
    """(answer ids, logprob of every token after the first: prompt and answer) from transformers' model."""
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(LLAVA_TINY, torch_dtype=torch.float32).eval()
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] == model.config.text_config.eos_token_id:
                break
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    return ids[len(prompt_ids):], [float(logprobs[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(bodies):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(LLAVA_TINY)
    prompt_ids = tokenizer("The shape is")["input_ids"]  # a text prompt runs with BOS, as the server runs it
    assert prompt_ids[0] == tokenizer.bos_token_id
    body = bodies["echo"]
    (choice,) = body["choices"]
    answer_ids, reference = _transformers_greedy(prompt_ids, 4)
    assert choice["text"] == tokenizer.decode(prompt_ids + answer_ids, skip_special_tokens=True)
    assert choice["text"] == "The shape is" + bodies["zero"]["choices"][0]["text"]
    assert body["usage"] == bodies["zero"]["usage"] and body["usage"]["prompt_tokens"] == len(prompt_ids)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt_ids) + len(answer_ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None, "nothing predicts it"
    assert logprobs["token_logprobs"][1:] == pytest.approx(reference, abs=1e-4)
    assert all(len(entry) in (1, 2) for entry in logprobs["top_logprobs"][1:]), "the top 1 and the token itself"
    assert logprobs["text_offset"] == [sum(map(len, logprobs["tokens"][:i])) for i in range(len(logprobs["tokens"]))]


def test_logprobs_zero_gives_the_sampled_token_alone(bodies):
    logprobs = bodies["zero"]["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == bodies["zero"]["usage"]["completion_tokens"] >= 1
    assert logprobs["top_logprobs"] == [{t: lp} for t, lp in zip(logprobs["tokens"], logprobs["token_logprobs"])]


def test_a_token_id_prompt_runs_as_given_and_echoes_as_its_text(bodies):
    from transformers import AutoTokenizer

    body = bodies["ids"]
    assert body["usage"]["prompt_tokens"] == 4, "no BOS added to token ids"
    echo = AutoTokenizer.from_pretrained(LLAVA_TINY).decode([1, 50, 60, 70], skip_special_tokens=True)
    assert body["choices"][0]["text"].startswith(echo) and body["choices"][0]["logprobs"] is None


def test_structured_output_gives_one_of_the_choices(bodies):
    (choice,) = bodies["choice"]["choices"]
    assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop"


@pytest.mark.parametrize("body,fragments", [
    ({"prompt": [1, 427, 427]}, ["line 2 (custom_id 'bad')", "prompt", "image tokens"]),  # the engine's check
    ({"prompt": "x", "logit_bias": {"99999": 5}}, ["line 2 (custom_id 'bad')", "logit_bias", "vocabulary"]),
    ({"prompt": ["x", [99999]]}, ["line 2", "body.prompt"]),
])
def test_a_line_the_model_refuses_fails_the_run_naming_it(tmp_path, body, fragments):
    batch = write_jsonl(tmp_path / "requests.jsonl", [completion_request("ok", "Hi"),
                                                      completion_request("bad", **body)])
    result = run_cli("run", "pipeline=llava_chat", f"input={batch}", f"output={tmp_path / 'answers.jsonl'}")
    assert_user_error(result, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.jsonl"], "no output file"
