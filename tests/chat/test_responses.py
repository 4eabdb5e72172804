"""`chat_responses`: the OpenAI batch output format and the all-or-nothing write."""
import json
import os

import pytest

from appliance.config.compose import compose
from appliance.engine.outputs import RequestOutput
from appliance.stages.chat import responses
from appliance.stages.chat.responses import ChatResponses, write_atomic


def _stage():
    return ChatResponses(ChatResponses.Options(), compose(["pipeline=llava_chat"]))


def _record(i, count, output_path, text="The shape is red.", model_name="m"):
    completion = RequestOutput(request_id=str(i), prompt_token_ids=[1] * (10 + i), text=text,
                               token_ids=[5, 6, 7], finished=True, finish_reason="stop")
    return {"choices": [completion], "completion_prompt": None, "echo": False, "prompt_number": 0, "prompt_count": 1,
            "custom_id": f"req-{i}", "model_name": model_name,
            "output_path": output_path, "request_index": i, "request_count": count}


def test_batch_output_format(tmp_path):
    out = tmp_path / "answers.jsonl"
    results = list(_stage().process(iter([_record(i, 3, str(out)) for i in range(3)])))
    assert results == [{"output_path": str(out), "display": f"wrote 3 answers to {out}"}]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["req-0", "req-1", "req-2"]
    ids = set()
    for i, line in enumerate(lines):
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["id"].startswith("batch_req_")
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["model"] == "m" and isinstance(body["created"], int)
        assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "The shape is red."},
                                    "logprobs": None, "finish_reason": "stop"}]
        assert body["usage"] == {"prompt_tokens": 10 + i, "completion_tokens": 3, "total_tokens": 13 + i}
        ids |= {line["id"], body["id"], response["request_id"]}
    assert len(ids) == 9, "ids are unique"
    assert not [p for p in os.listdir(tmp_path) if p != "answers.jsonl"], "no temp file left"
    assert oct(out.stat().st_mode & 0o777) != oct(0o600), "a normal file mode, not mkstemp's 0600"


def test_single_prompt_displays_the_answer():
    (result,) = _stage().process(iter([_record(0, 1, None, text=" The shape is red.\n", model_name=None)]))
    assert result["display"] == "The shape is red."
    assert result["response"]["choices"][0]["message"]["content"] == " The shape is red.\n"  # as generated
    assert result["response"]["model"] == "llava-tiny"  # cfg.model.name when the request names none


def test_write_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "answers.jsonl"

    def lines():
        yield {"a": 1}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_atomic(str(out), lines())
    assert os.listdir(tmp_path) == [], "neither the output nor a temp file"

    real_replace = os.replace
    seen = {}

    def replace(src, dst):  # at rename time every line is already on disk in the temp file
        seen["lines"] = open(src).read().count("\n")
        assert not os.path.exists(dst)
        real_replace(src, dst)

    monkeypatch.setattr(responses.os, "replace", replace)
    assert write_atomic(str(out), [{"a": i} for i in range(5)]) == 5
    assert seen["lines"] == 5 and out.read_text().count("\n") == 5


def test_incomplete_batch_writes_nothing(tmp_path):
    out = tmp_path / "answers.jsonl"
    with pytest.raises(RuntimeError, match="incomplete"):
        list(_stage().process(iter([_record(0, 2, str(out))])))
    assert os.listdir(tmp_path) == []


def test_one_answer_is_counted_in_the_singular(tmp_path):
    out = tmp_path / "answers.jsonl"
    (result,) = _stage().process(iter([_record(0, 1, str(out))]))
    assert result["display"] == f"wrote 1 answer to {out}"


def test_an_existing_output_is_replaced_whole_or_left_as_it_was(tmp_path):
    """`overwrite=true`: the old file stays untouched until every answer is written, then is replaced."""
    out = tmp_path / "answers.jsonl"
    out.write_text("old\n")
    with pytest.raises(RuntimeError, match="incomplete"):
        list(_stage().process(iter([_record(0, 2, str(out))])))  # the run stops after one of two answers
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["answers.jsonl"]
    list(_stage().process(iter([_record(i, 2, str(out)) for i in range(2)])))
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["req-0", "req-1"]
    assert os.listdir(tmp_path) == ["answers.jsonl"]
