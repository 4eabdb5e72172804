"""`appliance run pipeline=llava_chat` as a user runs it: a subprocess, real checkpoints.

- a text-only tiny Llama (random weights): a batch file -> answers.jsonl whose answers equal the engine's
  own greedy output for the same chat-templated prompts; a single prompt printed; bad input -> exit 2;
- the embedded tiny LLaVA (`appliance/assets/models/llava_tiny`), when it and the engine's LLaVA model
  exist: a synthetic shape image -> an answer naming the shape's colour.
"""
import base64
import json
import os
import re

import pytest

from tests.chat.conftest import (batch_request, clear_samples, completion_request, names_only, synthetic_shapes,
                                 text_overrides, write_jsonl)
from tests.conftest import REPO, assert_user_error, run_cli

LLAVA_TINY = REPO / "appliance" / "assets" / "models" / "llava_tiny"
PLUGIN = "plugins=[appliance.stages.chat]"


def _engine_has(architecture):
    from appliance.engine.models import MODEL_REGISTRY

    return architecture in MODEL_REGISTRY


def _chat(*args, timeout=300):
    return run_cli("run", *args, timeout=timeout)


def _overrides(model_dir, *extra):
    return [o for o in text_overrides(model_dir, *extra) if not o.startswith("plugins=")] + [PLUGIN]


def test_batch_file_text_only(text_llama_dir, tmp_path):
    questions = {"a": ("Hello there", 6), "b": ("the quick brown fox", 3), "c": ("def add(a, b):", 5)}
    batch = write_jsonl(tmp_path / "requests.jsonl",
                        [batch_request(cid, [{"type": "text", "text": q}], max_tokens=n, temperature=0)
                         for cid, (q, n) in questions.items()])
    out = tmp_path / "answers.jsonl"
    result = _chat(*_overrides(text_llama_dir, f"input={batch}", f"output={out}"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote 3 answers to {out}"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "b", "c"]
    assert sorted(os.listdir(tmp_path)) == ["answers.jsonl", "requests.jsonl"]

    from transformers import AutoTokenizer

    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams

    tok = AutoTokenizer.from_pretrained(text_llama_dir)
    engine = LLMEngine(text_llama_dir, EngineConfig(num_kv_blocks=64))
    try:
        for line, (cid, (question, max_tokens)) in zip(lines, questions.items()):
            ids = tok(f"<user>{question}\n<assistant>", add_special_tokens=True)["input_ids"]
            (expected,) = engine.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens))
            body = line["response"]["body"]
            assert body["choices"][0]["message"]["content"] == expected.text, cid
            assert body["usage"]["prompt_tokens"] == len(ids)
            assert body["usage"]["completion_tokens"] == len(expected.token_ids) <= max_tokens
            assert body["model"] == "m"
    finally:
        engine.close()


def test_batch_reports_answers_done_on_stderr(text_llama_dir, tmp_path):
    """stderr a pipe: plain progress lines end with 4/4 answers (100 %) and tokens/s; stdout holds the result."""
    batch = write_jsonl(tmp_path / "requests.jsonl", [batch_request(f"q{i}", "Hello there", max_tokens=3 + i,
                                                                    temperature=0) for i in range(4)])
    out = tmp_path / "answers.jsonl"
    result = _chat(*_overrides(text_llama_dir, f"input={batch}", f"output={out}"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote 4 answers to {out}\n"
    lines = result.stderr.splitlines()
    assert lines and all(re.fullmatch(r"requests\.jsonl: \d/4 answers \(\d+%\), \d+\.\d tokens/s, (eta|in) \S+", line)
                         for line in lines), result.stderr
    assert re.fullmatch(r"requests\.jsonl: 4/4 answers \(100%\), \d+\.\d tokens/s, in \d+\S*", lines[-1]), lines


def test_batch_file_completion_lines(text_llama_dir, tmp_path):
    """`/v1/completions` lines beside a chat line: the raw prompt runs (no chat template; a text with BOS,
    as the server encodes it, token ids as given), answering as the engine does for the same ids."""
    lines = [completion_request("text", "Hello there", max_tokens=5, temperature=0),
             batch_request("chat", "Hi", max_tokens=2),
             completion_request("ids", [[1, 40, 41], [1, 42]], max_tokens=3, temperature=0)]
    out = tmp_path / "answers.jsonl"
    result = _chat(*_overrides(text_llama_dir, f"input={write_jsonl(tmp_path / 'requests.jsonl', lines)}",
                               f"output={out}"))
    assert result.returncode == 0, result.stderr
    bodies = [json.loads(line)["response"]["body"] for line in out.read_text().splitlines()]
    assert [b["object"] for b in bodies] == ["text_completion", "chat.completion", "text_completion"]

    from transformers import AutoTokenizer

    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams

    text_ids = AutoTokenizer.from_pretrained(text_llama_dir)("Hello there")["input_ids"]
    engine = LLMEngine(text_llama_dir, EngineConfig(num_kv_blocks=64))
    try:
        for body, prompts, max_tokens in ((bodies[0], [text_ids], 5), (bodies[2], [[1, 40, 41], [1, 42]], 3)):
            expected = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
            assert [c["text"] for c in body["choices"]] == [e.text for e in expected]
            assert [c["index"] for c in body["choices"]] == list(range(len(prompts)))
            assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))
            assert body["usage"]["completion_tokens"] == sum(len(e.token_ids) for e in expected)
    finally:
        engine.close()


def test_overwrite_replaces_an_existing_answers_file(text_llama_dir, tmp_path):
    batch = write_jsonl(tmp_path / "requests.jsonl", [batch_request("a", "Hi", max_tokens=2)])
    out = tmp_path / "answers.jsonl"
    out.write_text("old\n")
    assert_user_error(_chat(*_overrides(text_llama_dir, f"input={batch}", f"output={out}")),
                      "answers.jsonl exists; pass overwrite=true")
    result = _chat(*_overrides(text_llama_dir, f"input={batch}", f"output={out}", "overwrite=true"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote 1 answer to {out}"
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["a"]
    assert sorted(os.listdir(tmp_path)) == ["answers.jsonl", "requests.jsonl"]


def test_single_text_prompt_prints_the_answer(text_llama_dir):
    result = _chat(*_overrides(text_llama_dir, "prompt=Hello", "pipeline.stages.engine.sampling.max_tokens=4"))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) > 0


def on_a_terminal(*args):
    """`appliance run ARGS` with stdout a pseudo-terminal, as a person runs it: (exit code, stdout)."""
    import pty
    import subprocess
    import sys

    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with subprocess.Popen([sys.executable, "-m", "appliance.cli", "run", *args], stdout=secondary,
                          stderr=subprocess.DEVNULL, cwd=REPO, env=env) as process:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the run closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(primary)
        code = process.wait(timeout=300)
    return code, b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal's line ends


def test_a_single_answer_is_rendered_on_a_terminal_and_printed_as_written_when_piped(text_llama_dir, monkeypatch):
    from io import StringIO

    from appliance.display import MarkdownText, show

    monkeypatch.setenv("COLUMNS", "100")  # the same width for the run and for the rendering here
    monkeypatch.setenv("TERM", "xterm-256color")
    args = _overrides(text_llama_dir, "prompt=Hello", "pipeline.stages.engine.sampling.max_tokens=8")
    piped = _chat(*args)
    assert piped.returncode == 0, piped.stderr
    answer = piped.stdout.removesuffix("\n")  # greedy: the answer the terminal gets too
    rendered = StringIO()
    show(MarkdownText(answer), rendered, terminal=True)
    assert on_a_terminal(*args) == (0, rendered.getvalue())
    assert rendered.getvalue() != piped.stdout  # rich's layout, not the text as written


@pytest.mark.parametrize("line,fragments", [
    ('{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}], "best_of": 2}}',
     ["line 2", "body.best_of", "unknown"]),
    ('{"custom_id": "a", "url": "/v1/embeddings", "body": {"messages": []}}', ["line 2", "url"]),
    ("{oops", ["line 2", "not valid JSON"]),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": 5}}', ["line 2", "body.prompt"]),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x", "logprobs": 30}}',
     ["line 2", "body.logprobs"]),
])
def test_bad_line_fails_before_any_work(text_llama_dir, tmp_path, line, fragments):
    batch = write_jsonl(tmp_path / "requests.jsonl", [batch_request("ok", "Hi"), line])
    out = tmp_path / "answers.jsonl"
    result = _chat(*_overrides(text_llama_dir, f"input={batch}", f"output={out}"))
    assert_user_error(result, *fragments)
    assert sorted(os.listdir(tmp_path)) == ["requests.jsonl"]


def test_prompt_longer_than_the_context_is_a_user_error(text_llama_dir, tmp_path):
    batch = write_jsonl(tmp_path / "requests.jsonl",
                        [batch_request("short", "Hi"), batch_request("long", "the quick brown fox " * 40)])
    result = _chat(*_overrides(text_llama_dir, f"input={batch}", f"output={tmp_path / 'a.jsonl'}",
                               "engine.max_model_len=64"))
    assert_user_error(result, "requests.jsonl line 2 (custom_id 'long')", "context is 64 tokens")
    assert sorted(os.listdir(tmp_path)) == ["requests.jsonl"]


def test_image_and_prompt_on_a_random_tiny_llava(tmp_path):
    """The image path through the CLI: a photo in another directory, the answer printed (random weights:
    any text); a missing image is refused."""
    from tests.chat.conftest import png_bytes
    from tests.chat.test_llava_pipeline import write_random_llava

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_random_llava(model_dir, next_=False)
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "red.png").write_bytes(png_bytes(120, 80, (220, 30, 30)))
    common = ["pipeline=llava_chat", PLUGIN, f"model.path={model_dir}", "model.name=tiny-random",
              "engine.num_kv_blocks=64", "pipeline.stages.engine.sampling.max_tokens=4"]
    result = _chat(*common, f"input={photos / 'red.png'}", "prompt=What color?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stderr.count("Traceback") == 0
    assert_user_error(_chat(*common, f"input={photos / 'nope.png'}", "prompt=What color?"),
                      "input:", "nope.png is not a file")


def _llava_missing():
    if not (LLAVA_TINY / "config.json").is_file():
        return "appliance/assets/models/llava_tiny is not there yet (scripts/train_tiny_llava.py)"
    if not _engine_has("LlavaForConditionalGeneration"):
        return "the engine has no LlavaForConditionalGeneration in MODEL_REGISTRY yet"
    return None


llava_tiny = pytest.mark.skipif(_llava_missing() is not None, reason=str(_llava_missing()))


@llava_tiny
def test_llava_tiny_names_the_colour(tmp_path):
    """The demo command: `appliance run pipeline=llava_chat input=shape.png prompt="What color is the shape?"`."""
    shapes = synthetic_shapes()
    image, labels = next(clear_samples(shapes, 1))
    image.save(tmp_path / "shape.png")
    result = _chat("pipeline=llava_chat", PLUGIN, f"input={tmp_path / 'shape.png'}", "prompt=What color is the shape?")
    assert result.returncode == 0, result.stderr
    assert names_only(result.stdout, labels.color, shapes.COLORS), (labels, result.stdout)


@llava_tiny
def test_a_prompt_with_punctuation_runs_on_the_bundled_sample():
    """Typed the natural way: quotes, parentheses, `=`, commas and brackets reach the model as text."""
    sample = REPO / "appliance" / "assets" / "samples" / "orange_star.png"
    result = _chat("pipeline=llava_chat", f"input={sample}", "prompt=What's this? (a=b, [c])",
                   "system=Answer briefly, \"please\".", "pipeline.stages.engine.sampling.max_tokens=8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "Traceback" not in result.stderr


@llava_tiny
def test_llava_tiny_batch_of_images(tmp_path):
    """12 images in one batch file (data URLs and local paths): at least 10 answers name the right colour."""
    shapes = synthetic_shapes()
    samples = list(clear_samples(shapes, 12, first_seed=2000))
    lines = []
    for i, (image, _) in enumerate(samples):
        image.save(tmp_path / f"{i}.png")
        url = f"{i}.png" if i % 2 else "data:image/png;base64," + base64.b64encode(
            (tmp_path / f"{i}.png").read_bytes()).decode()
        lines.append(batch_request(f"img-{i}", [{"type": "image_url", "image_url": {"url": url}},
                                                {"type": "text", "text": "What color is the shape?"}]))
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "answers.jsonl"
    result = _chat("pipeline=llava_chat", PLUGIN, f"input={batch}", f"output={out}")
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["custom_id"] for a in answers] == [f"img-{i}" for i in range(12)]
    texts = [a["response"]["body"]["choices"][0]["message"]["content"] for a in answers]
    right = sum(names_only(text, labels.color, shapes.COLORS) for text, (_, labels) in zip(texts, samples))
    assert right >= 10, list(zip(texts, [labels.color for _, labels in samples]))
    assert all(a["response"]["body"]["usage"]["prompt_tokens"] > 64 for a in answers)  # 64 image tokens each
