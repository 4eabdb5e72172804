"""Several answers in one request through `appliance serve` and the official `openai` client: `n`, a list
of prompts, `echo`, and `logprobs: 0`, streaming and not."""
import json
import random
from collections import defaultdict

import httpx
import openai
import pytest

from tests.chat.conftest import batch_request, completion_request, write_jsonl
from tests.conftest import run_cli
from tests.servers import data_url, error, image_question, metrics, wait_idle

BLOCK = 16  # engine.block_size of the default engine config


@pytest.fixture(scope="module")
def client(llava_server):
    return openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, **fields):
    return client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), **fields)


def complete(client, **fields):
    return client.completions.create(model="llava-tiny", **{"prompt": "The shape is", **fields})


def by_index(chunks, text_of):
    """{choice index: (joined text, [finish reasons seen])} of a stream's chunks."""
    texts, reasons = defaultdict(str), defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += text_of(choice) or ""
            if choice.finish_reason is not None:
                reasons[choice.index].append(choice.finish_reason)
    return {i: (texts[i], reasons[i]) for i in texts}


def test_chat_n3_gives_three_indexed_choices_and_usage_counts_the_prompt_once(client):
    one = chat(client, max_tokens=8, temperature=0)
    three = chat(client, n=3, max_tokens=8, temperature=1.0, seed=11, logprobs=True)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    tokens = [len(c.logprobs.content) for c in three.choices]
    assert three.usage.completion_tokens == sum(tokens) and all(1 <= t <= 8 for t in tokens)
    assert three.usage.total_tokens == three.usage.prompt_tokens + sum(tokens)

    streamed = list(chat(client, n=3, max_tokens=8, temperature=1.0, seed=11, stream=True,
                         stream_options={"include_usage": True}))
    roles = [c.choices[0].index for c in streamed if c.choices and c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2], "a role chunk per choice"
    answers = by_index(streamed, lambda choice: choice.delta.content)
    assert sorted(answers) == [0, 1, 2]
    for choice in three.choices:  # same seed, same answers, streamed or not; one finish chunk each
        assert answers[choice.index] == (choice.message.content, [choice.finish_reason])
    assert streamed[-1].choices == [] and streamed[-1].usage == three.usage


def test_completions_n3_streaming_and_not(client):
    whole = complete(client, n=3, max_tokens=6, temperature=1.0, seed=5, logprobs=1)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert whole.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in whole.choices)
    streamed = list(complete(client, n=3, max_tokens=6, temperature=1.0, seed=5, stream=True,
                             stream_options={"include_usage": True}))
    answers = by_index(streamed, lambda choice: choice.text)
    assert answers == {c.index: (c.text, [c.finish_reason]) for c in whole.choices}
    assert streamed[-1].usage == whole.usage


def test_n_with_a_seed_is_reproducible_and_answer_i_samples_with_seed_plus_i(client):
    def texts(**fields):
        return [c.text for c in complete(client, prompt="Once", max_tokens=12, temperature=1.5, **fields).choices]

    first = texts(n=3, seed=21)
    assert texts(n=3, seed=21) == first
    assert len(set(first)) > 1, "the answers sample differently"
    assert [texts(seed=21 + i)[0] for i in range(3)] == first, "choice i is the answer a request with seed + i gets"


def test_n_at_temperature_zero_gives_the_greedy_answer_n_times(client):
    greedy = complete(client, max_tokens=8, temperature=0).choices[0].text
    assert [c.text for c in complete(client, n=4, max_tokens=8, temperature=0).choices] == [greedy] * 4


def test_the_prompt_is_computed_once_for_all_answers(llava_server, client):
    prompt = random.Random(31).choices(range(100, 400), k=2 * BLOCK + 9)  # 2 full blocks, never seen before
    before = metrics(llava_server.base)
    answer = complete(client, prompt=prompt, n=3, max_tokens=2, temperature=0)
    after = metrics(llava_server.base)

    def grew(name):
        return after[(name, ())] - before[(name, ())]

    assert answer.usage.prompt_tokens == len(prompt) and len(answer.choices) == 3
    assert grew("appliance_prompt_tokens_total") == len(prompt)
    assert grew("appliance_prefix_cache_hits_total") == 2 * 2 * BLOCK, \
        "each of the two other answers found the first one's two full prompt blocks"


def test_a_list_of_prompts_times_n_gives_choices_in_vllm_order(client):
    prompts = ["The shape is", "What color is"]
    alone = [complete(client, prompt=p, max_tokens=5, temperature=0) for p in prompts]
    both = complete(client, prompt=prompts, n=2, max_tokens=5, temperature=0)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    streamed = by_index(complete(client, prompt=prompts, n=2, max_tokens=5, temperature=0, stream=True),
                        lambda choice: choice.text)
    assert {i: text for i, (text, _) in streamed.items()} == {c.index: c.text for c in both.choices}
    ids = complete(client, prompt=[[1, 20, 30, 40], [1, 50, 60, 70]], max_tokens=3, temperature=0)
    assert [c.index for c in ids.choices] == [0, 1] and ids.usage.prompt_tokens == 8


def test_echo_with_logprobs_scores_the_prompt_then_the_answer(client):
    plain = complete(client, max_tokens=4, temperature=0, logprobs=1)
    echoed = complete(client, max_tokens=4, temperature=0, logprobs=1, echo=True)
    choice = echoed.choices[0]
    assert choice.text == "The shape is" + plain.choices[0].text
    lp = choice.logprobs
    assert len(lp.tokens) == echoed.usage.prompt_tokens + echoed.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    prompt_tokens = echoed.usage.prompt_tokens
    assert lp.tokens[prompt_tokens:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[prompt_tokens:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert echoed.usage == plain.usage, "usage counts the prompt once, as without echo"

    # n = 2: both answers start with the prompt and carry its logprobs (scored once)
    two = complete(client, max_tokens=4, temperature=0, logprobs=1, echo=True, n=2)
    assert [c.text for c in two.choices] == [choice.text] * 2
    assert all(c.logprobs.token_logprobs[:prompt_tokens] == lp.token_logprobs[:prompt_tokens] for c in two.choices)

    streamed = list(complete(client, max_tokens=4, temperature=0, logprobs=1, echo=True, stream=True))
    texts = [c.choices[0].text for c in streamed if c.choices and c.choices[0].text]
    assert texts[0].startswith("The shape is") and "".join(texts) == choice.text
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


def test_echo_without_logprobs_prefixes_the_prompt(client):
    texts, ids = ["The shape is", "A red"], [[1, 50, 60, 70], [1, 80, 90]]  # OpenAI: texts or ids, not both
    plain_texts, plain_ids = (complete(client, prompt=prompt, max_tokens=4, temperature=0) for prompt in (texts, ids))
    echoed_texts, echoed_ids = (complete(client, prompt=prompt, max_tokens=4, temperature=0, echo=True)
                                for prompt in (texts, ids))
    assert [c.text for c in echoed_texts.choices] == [t + c.text for t, c in zip(texts, plain_texts.choices)]
    for mine, without in zip(echoed_ids.choices, plain_ids.choices):
        assert mine.text.endswith(without.text) and len(mine.text) > len(without.text), \
            "a token-id prompt echoes as its decoded text"
    assert echoed_texts.choices[0].logprobs is None


def test_logprobs_zero_gives_the_sampled_token_in_each_top_logprobs_entry(client):
    lp = complete(client, max_tokens=4, temperature=0, logprobs=0).choices[0].logprobs
    assert len(lp.tokens) >= 1
    assert lp.top_logprobs == [{token: value} for token, value in zip(lp.tokens, lp.token_logprobs)]


def test_aborting_a_streaming_n2_request_frees_every_answer(llava_server):
    base = llava_server.base
    before = metrics(base)
    body = {"prompt": "The shape is", "n": 2, "max_tokens": 200, "temperature": 1.0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        seen = set()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    seen.add(chunk["choices"][0]["index"])
            if seen == {0, 1}:
                break  # both answers run; closing the connection aborts the request
    after = wait_idle(base)
    assert after[("appliance_num_requests_running", ())] == 0
    assert after[("appliance_kv_cache_usage_perc", ())] == 0, "no answer holds a KV block"
    aborted = ("appliance_request_success_total", (("finished_reason", "abort"),))
    assert after.get(aborted, 0) - before.get(aborted, 0) == 1


def test_the_batch_verb_answers_n_as_the_server(client, tmp_path):
    """A batch line asking n answers gets the same n answers (and usage) as the server gives."""
    lines = [batch_request("a", "Once upon a time", n=3, max_tokens=8, temperature=1.5, seed=4)]
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    result = run_cli("run", "pipeline=llava_chat", f"input={batch}", f"output={tmp_path / 'answers.jsonl'}")
    assert result.returncode == 0, result.stderr
    offline = json.loads((tmp_path / "answers.jsonl").read_text())["response"]["body"]
    online = client.chat.completions.create(**{**lines[0]["body"], "model": "llava-tiny"})
    assert [c["index"] for c in offline["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in offline["choices"]] == [c.message.content for c in online.choices]
    assert len({c.message.content for c in online.choices}) > 1, "the answers sample differently"
    assert offline["usage"] == online.usage.model_dump(exclude_none=True)


def test_the_batch_verb_answers_completions_as_the_server(client, tmp_path):
    """Completion lines (prompts x n with echo and logprobs; logprobs 0; structured output) get the bodies
    the server answers: the same choices, texts and usage, token logprobs within 1e-4."""
    bodies = [{"prompt": ["The shape is", "What color is"], "n": 2, "echo": True, "logprobs": 1, "max_tokens": 5,
               "temperature": 0},
              {"prompt": [[1, 50, 60, 70]], "logprobs": 0, "max_tokens": 4, "temperature": 0},
              {"prompt": "Is it red?", "max_tokens": 5,
               "extra_body": {"structured_outputs": {"choice": ["yes", "no"]}}}]
    lines = [completion_request(f"c{i}", **{k: v for k, v in body.items() if k != "extra_body"},
                                **body.get("extra_body", {})) for i, body in enumerate(bodies)]
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    result = run_cli("run", "pipeline=llava_chat", f"input={batch}", f"output={tmp_path / 'answers.jsonl'}")
    assert result.returncode == 0, result.stderr
    offline = [json.loads(line)["response"]["body"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    for mine, body in zip(offline, bodies):
        answer = complete(client, **body)
        online = answer.model_dump()
        assert mine["object"] == online["object"] == "text_completion"
        assert mine["usage"] == answer.usage.model_dump(exclude_none=True)
        assert [(c["index"], c["text"], c["finish_reason"]) for c in mine["choices"]] == \
            [(c["index"], c["text"], c["finish_reason"]) for c in online["choices"]]
        for served, offline_choice in zip(online["choices"], mine["choices"]):
            if served["logprobs"] is None:
                assert offline_choice["logprobs"] is None
                continue
            served, logprobs = served["logprobs"], offline_choice["logprobs"]
            assert logprobs["tokens"] == served["tokens"] and logprobs["text_offset"] == served["text_offset"]
            assert [v is None for v in logprobs["token_logprobs"]] == [v is None for v in served["token_logprobs"]]
            assert [v for v in logprobs["token_logprobs"] if v is not None] == \
                pytest.approx([v for v in served["token_logprobs"] if v is not None], abs=1e-4)
    echoed = offline[0]["choices"]
    assert [c["index"] for c in echoed] == [0, 1, 2, 3] and echoed[0]["text"].startswith("The shape is")
    assert echoed[0]["logprobs"]["token_logprobs"][0] is None
    assert offline[2]["choices"][0]["text"] in ("yes", "no")


def test_more_than_1024_answers_in_one_request_are_refused(llava_server):
    response = httpx.post(f"{llava_server.base}/v1/completions", timeout=60,
                          json={"prompt": ["a"] * 9, "n": 128, "max_tokens": 1})
    assert response.status_code == 400
    assert error(response)["param"] == "prompt" and "1152 answers" in error(response)["message"]
