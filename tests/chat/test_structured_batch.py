"""The offline batch verb takes the same structured-output and sampling fields as the server."""
import json

from appliance.config.compose import compose
from appliance.stages.build import build_pipeline
from tests.chat.conftest import batch_request, write_jsonl

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["shape"],
          "properties": {"shape": {"type": "string", "enum": ["square", "circle", "star"]}}}


def test_a_batch_file_with_structured_requests(tmp_path):
    question = [{"type": "text", "text": "What shape is it?"}]
    lines = [
        batch_request("schema", question, max_tokens=32, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "shape", "schema": SCHEMA}}),
        batch_request("choice", question, max_tokens=8, temperature=0,
                      structured_outputs={"choice": ["yes", "no"]}),
        batch_request("developer", [{"type": "text", "text": "Hi"}], max_tokens=4, temperature=0),
    ]
    lines[2]["body"]["messages"].insert(0, {"role": "developer", "content": "Be brief.", "name": "x"})
    output = tmp_path / "answers.jsonl"
    pipeline = build_pipeline(compose(["pipeline=llava_chat"]))
    try:
        list(pipeline.run([{"input": str(write_jsonl(tmp_path / "requests.jsonl", lines)),
                            "output": str(output), "prompt": None}]))
    finally:
        pipeline.close()
    answers = {a["custom_id"]: a["response"]["body"]["choices"][0] for a in map(json.loads, output.open())}
    assert json.loads(answers["schema"]["message"]["content"])["shape"] in ("square", "circle", "star")
    assert answers["choice"]["message"]["content"] in ("yes", "no")
    assert answers["schema"]["finish_reason"] == answers["choice"]["finish_reason"] == "stop"
    assert answers["developer"]["message"]["content"]
