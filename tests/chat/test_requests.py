"""`chat_requests`: batch lines and run records, good and bad (pure parsing; no model)."""
import json
import os
import re

import pytest

from appliance.errors import InputError
from appliance.stages.chat.requests import parse_batch_line, plan_run, read_batch_file
from tests.chat.conftest import batch_request, completion_request, write_jsonl

GOOD = [
    ("text only, no sampling", batch_request("a", "Hi"), {}),
    ("parts with an image", batch_request("b", [{"type": "text", "text": "What?"},
                                                {"type": "image_url", "image_url": {"url": "x.png"}}]), {}),
    ("sampling fields", batch_request("c", "Hi", max_tokens=5, temperature=0.5, top_p=0.9, top_k=3, seed=7,
                                      stop=["\n"]),
     {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 7, "stop": ["\n"]}),
    ("max_completion_tokens, integral float", batch_request("d", "Hi", max_completion_tokens=4.0), {"max_tokens": 4}),
    ("null fields are unset", batch_request("e", "Hi", temperature=None), {}),
    ("method and url may be left out", {"custom_id": "f", "body": {"messages": [{"role": "user", "content": "x"}]}},
     {}),
    ("system and assistant turns", {"custom_id": "g", "body": {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]}}, {}),
]


@pytest.mark.parametrize("label,line,sampling", GOOD, ids=[g[0] for g in GOOD])
def test_good_lines(label, line, sampling):
    request = parse_batch_line(json.dumps(line), 3)
    assert request.custom_id == line["custom_id"] and request.line == 3
    assert request.sampling == {**sampling, "decode_after_prompt": False}, "a chat answer is decoded alone"
    assert request.messages == line["body"]["messages"]


def test_completion_lines_are_parsed_as_the_server_parses_them():
    request = parse_batch_line(json.dumps(completion_request("c", ["The", "A"], n=2, echo=True, logprobs=1,
                                                             max_tokens=3, seed=4, logit_bias={"5": -100})), 2)
    assert request.messages is None and request.prompts == ["The", "A"] and request.echo
    assert (request.n, request.top_logprobs, request.line) == (2, 1, 2)
    assert request.sampling == {"max_tokens": 3, "seed": 4, "logit_bias": {5: -100}, "logprobs": 1,
                                "prompt_logprobs": 1}, "echo with logprobs scores the prompt, as on the server"
    ids = parse_batch_line(json.dumps(completion_request("d", [1, 20, 30])), 3)
    assert ids.prompts == [[1, 20, 30]] and not ids.echo and ids.top_logprobs is None


def test_a_file_may_mix_chat_and_completion_lines(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [batch_request("a", "Hi"), completion_request("b", "Hello")])
    chat, completion = read_batch_file(str(path))
    assert chat.prompts is None and chat.messages == [{"role": "user", "content": "Hi"}]
    assert completion.prompts == ["Hello"] and completion.messages is None


def _with(body=None, **top):
    line = batch_request("r", "Hi")
    line["body"].update(body or {})
    line.update(top)
    return json.dumps(line)


BAD = [
    ("not JSON", '{"custom_id": "a",', ["line 4", "not valid JSON"]),
    ("not an object", "[1, 2]", ["line 4", "expected a JSON object"]),
    ("unknown top-level field", _with(extra=1), ["line 4", "extra: unknown field"]),
    ("missing custom_id", json.dumps({"body": {"messages": []}}), ["line 4", "custom_id: required"]),
    ("wrong url", _with(url="/v1/embeddings"), ["line 4", "url: '/v1/embeddings'; allowed: /v1/chat/completions, "
                                                  "/v1/completions"]),
    ("chat body on the completions url", _with(url="/v1/completions"), ["line 4", "body.prompt: required"]),
    ("completion without a body", json.dumps({"custom_id": "a", "url": "/v1/completions"}),
     ["line 4", "body: required", "prompt"]),
    ("empty prompt", json.dumps(completion_request("a", "")), ["line 4", "body.prompt", "non-empty"]),
    ("texts and token ids mixed", json.dumps(completion_request("a", ["x", [1, 2]])), ["line 4", "body.prompt"]),
    ("logprobs past 20", json.dumps(completion_request("a", "x", logprobs=21)), ["line 4", "body.logprobs"]),
    ("bad logit_bias key", json.dumps(completion_request("a", "x", logit_bias={"a": 1})),
     ["line 4", "body.logit_bias"]),
    ("bad structured output", json.dumps(completion_request("a", "x", structured_outputs={"choice": []})),
     ["line 4", "body.structured_outputs.choice"]),
    ("stream a completion", json.dumps(completion_request("a", "x", stream=True)), ["line 4", "body.stream"]),
    ("wrong method", _with(method="GET"), ["line 4", "method", "POST"]),
    ("missing body", json.dumps({"custom_id": "a", "url": "/v1/chat/completions"}), ["line 4", "body: required"]),
    ("missing messages", json.dumps({"custom_id": "a", "body": {"model": "m"}}), ["line 4", "body.messages: required"]),
    ("empty messages", _with({"messages": []}), ["line 4", "body.messages", "non-empty"]),
    ("unknown sampling field", _with({"frequency_penalty": 0.5}), ["line 4", "body.frequency_penalty", "allowed"]),
    ("logprobs wrong type", _with({"logprobs": 3}), ["line 4", "body.logprobs", "true or false"]),
    ("top_logprobs without logprobs", _with({"top_logprobs": 2}), ["line 4", "body.top_logprobs", "logprobs: true"]),
    ("NaN temperature", _with({"temperature": float("nan")}), ["line 4", "body.temperature", "a number"]),
    ("min_tokens above max_tokens", _with({"min_tokens": 9, "max_tokens": 4}), ["line 4", "min_tokens"]),
    ("stream in a batch", _with({"stream": True}), ["line 4", "body.stream", "cannot stream"]),
    ("temperature wrong type", _with({"temperature": "hot"}), ["line 4", "body.temperature", "a number"]),
    ("max_tokens bool", _with({"max_tokens": True}), ["line 4", "body.max_tokens", "an integer"]),
    ("max_tokens fraction", _with({"max_tokens": 2.5}), ["line 4", "body.max_tokens", "an integer"]),
    ("negative temperature", _with({"temperature": -1}), ["line 4", "temperature must be >= 0"]),
    ("zero max_tokens", _with({"max_tokens": 0}), ["line 4", "max_tokens must be >= 1"]),
    ("stop wrong type", _with({"stop": 5}), ["line 4", "body.stop"]),
    ("n zero", _with({"n": 0}), ["line 4", "body.n", "allowed: >= 1"]),
    ("n past 128", _with({"n": 129}), ["line 4", "body.n", "allowed: <= 128"]),
    ("n a fraction", _with({"n": 1.5}), ["line 4", "body.n", "an integer"]),
    ("echo in a chat", _with({"echo": True}), ["line 4", "body.echo", "unknown"]),
    ("stream", _with({"stream": True}), ["line 4", "body.stream"]),
    ("bad role", _with({"messages": [{"role": "robot", "content": "x"}]}), ["line 4", "messages[0].role", "allowed"]),
    ("bad part type", _with({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}),
     ["line 4", "messages[0].content[0].type", "text, image_url"]),
    ("image_url without url", _with({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {}}]}]}), ["line 4", "content[0].image_url.url: required"]),
    ("text part without text", _with({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
     ["line 4", "content[0].text: required"]),
]


@pytest.mark.parametrize("label,text,fragments", BAD, ids=[b[0] for b in BAD])
def test_bad_lines(label, text, fragments):
    with pytest.raises(InputError) as e:
        parse_batch_line(text, 4)
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))


def test_file_checks_every_line_and_names_the_line(tmp_path):
    good = batch_request("a", "Hi")
    path = write_jsonl(tmp_path / "r.jsonl", [good, "", batch_request("b", "x"), {**good, "custom_id": "b"}])
    with pytest.raises(InputError, match="line 4: custom_id 'b' repeats line 3"):
        read_batch_file(str(path))
    with pytest.raises(InputError, match="holds no requests"):
        read_batch_file(str(write_jsonl(tmp_path / "empty.jsonl", [""])))


def _record(**kw):
    return {"input": None, "output": None, "prompt": None, "prompt_file": None, "system": None, "overwrite": False,
            **kw}


def test_run_records(tmp_path):
    image = tmp_path / "photo.png"
    image.write_bytes(b"not decoded here")
    requests, output, media, _ = plan_run(_record(input=str(image), prompt="What?"), None)
    assert output is None and media == os.path.realpath(tmp_path)
    assert requests[0].messages == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "photo.png"}}, {"type": "text", "text": "What?"}]}]
    requests, _, _, _ = plan_run(_record(prompt="Hello"), None)
    assert requests[0].messages == [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("a", "Hi"), batch_request("b", "Yo")])
    requests, output, media, _ = plan_run(_record(input=str(batch), output=str(tmp_path / "a.jsonl")), None)
    assert [r.custom_id for r in requests] == ["a", "b"] and media == str(tmp_path)
    _, _, media, _ = plan_run(_record(input=str(batch), output=str(tmp_path / "a.jsonl")), "/srv/media")
    assert media == "/srv/media"


def test_a_prompt_file_and_a_system_message_make_the_request(tmp_path):
    image = tmp_path / "photo.png"
    image.write_bytes(b"not decoded here")
    question = "Line one: what's this?\n  (a=b, [c]) ${x} \\n é 图\n"
    (tmp_path / "q.txt").write_text(question, encoding="utf-8")
    requests, _, _, _ = plan_run(_record(input=str(image), prompt_file=str(tmp_path / "q.txt"),
                                         system=" Answer in one word. "), None)
    assert requests[0].messages == [
        {"role": "system", "content": " Answer in one word. "},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "photo.png"}},
                                     {"type": "text", "text": question}]}]


def test_overwrite_lets_a_batch_output_replace_an_existing_file(tmp_path):
    batch = write_jsonl(tmp_path / "r.jsonl", [batch_request("a", "Hi")])
    (tmp_path / "answers.jsonl").write_text("old answers\n")
    _, output, _, _ = plan_run(_record(input=str(batch), output=str(tmp_path / "answers.jsonl"), overwrite=True), None)
    assert output == str(tmp_path / "answers.jsonl")
    assert (tmp_path / "answers.jsonl").read_text() == "old answers\n"  # replaced only when all answers are written


@pytest.mark.parametrize("url", ["data:image/png;base64,iVBORw0KGgo=", "https://example.com/cat.jpg"])
def test_an_image_url_input_is_one_request_and_no_file(url):
    """Not a server file: the URL goes to the image loader (size limits, fetch timeout) as a part."""
    requests, output, media, source = plan_run(_record(input=url, prompt="What?"), None)
    assert output is None and media is None and source == "input"
    assert requests[0].messages[0]["content"][0] == {"type": "image_url", "image_url": {"url": url}}
    with pytest.raises(InputError, match="output: only used with a .jsonl input"):
        plan_run(_record(input=url, prompt="What?", output="a.jsonl"), None)


@pytest.mark.parametrize("record,fragment", [
    (dict(input="r.jsonl"), "output: required with a .jsonl input"),
    (dict(input="r.jsonl", output="r.jsonl"), "is the input file"),
    (dict(input="r.jsonl", output="exists.jsonl"), "exists; pass overwrite=true to replace it"),
    (dict(input="r.jsonl", output="."), "is a directory"),
    (dict(input="r.jsonl", output="exists.jsonl/a.jsonl"), "cannot write to directory"),
    (dict(input="r.jsonl", output="a.jsonl", prompt="x"), "prompt: not used with a .jsonl input"),
    (dict(input="r.jsonl", output="a.jsonl", prompt_file="q.txt"), "prompt_file: not used with a .jsonl input"),
    (dict(input="r.jsonl", output="a.jsonl", system="x"), "system: not used with a .jsonl input"),
    (dict(input="r.jsonl", output=".", overwrite=True), "is a directory"),
    (dict(input="photo.png"), "prompt: required with an image input"),
    (dict(input="photo.png", prompt=" \n"), "prompt: the question is empty"),
    (dict(input="photo.png", prompt="x", prompt_file="q.txt"), "prompt_file: given with prompt=; pass the question"),
    (dict(input="photo.png", prompt_file="nope.txt"), "prompt_file: cannot read nope.txt (No such file"),
    (dict(input="photo.png", prompt_file="latin1.txt"), "prompt_file: latin1.txt is not UTF-8 text"),
    (dict(input="photo.png", prompt_file="."), "prompt_file: cannot read ."),
    (dict(input="photo.png", prompt="x", output="a.jsonl"), "output: only used with a .jsonl input"),
    (dict(input="missing.png", prompt="x"), "input: missing.png is not a file"),
    (dict(), "input: missing; pass input=photo.png prompt="),  # no image given: not "prompt required"
    (dict(system="Be brief."), "input: missing"),
])
def test_bad_run_records(tmp_path, monkeypatch, record, fragment):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "r.jsonl", [batch_request("a", "Hi")])
    (tmp_path / "exists.jsonl").write_text("")
    (tmp_path / "photo.png").write_bytes(b"x")
    (tmp_path / "q.txt").write_text("What?")
    (tmp_path / "latin1.txt").write_bytes("Qu'est-ce que c'est, déjà ?".encode("latin-1"))
    with pytest.raises(InputError, match=re.escape(fragment)):
        plan_run(_record(**record), None)
