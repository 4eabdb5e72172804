"""Structured output and the sampling fields OpenAI and vLLM clients send, through `appliance serve`
with the official `openai` client (and httpx for raw bodies), streaming and not."""
import json
import re

import httpx
import openai
import pytest

from tests.servers import data_url, error, image_question

SHAPE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "shape"],
                "properties": {"color": {"type": "string", "enum": ["red", "orange", "green", "blue", "purple"]},
                               "shape": {"type": "string", "enum": ["square", "circle", "star", "triangle"]}}}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "shape", "schema": SHAPE_SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def client(llava_server):
    return openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, stream=False, **fields):
    answer = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()),
                                            temperature=0, stream=stream, **fields)
    if not stream:
        return answer.choices[0].message.content, answer.choices[0].finish_reason
    chunks = [c for c in answer if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_answer_is_that_json(client, stream):
    text, reason = ask(client, stream, max_tokens=64, response_format=RESPONSE_FORMAT)
    assert reason == "stop"
    value = json.loads(text)
    assert value["color"] in SHAPE_SCHEMA["properties"]["color"]["enum"]
    assert value["shape"] in SHAPE_SCHEMA["properties"]["shape"]["enum"]


OPEN_SCHEMA = {k: v for k, v in SHAPE_SCHEMA.items() if k != "additionalProperties"}  # as most clients write it


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "shape", "schema": OPEN_SCHEMA}}},
    {"extra_body": {"structured_outputs": {"json": OPEN_SCHEMA}}},
], ids=["response_format", "structured_outputs"])
def test_a_schema_that_leaves_additional_properties_unsaid_gets_only_its_keys(client, fields):
    """Strict mode, as vLLM's xgrammar: the tiny model would otherwise add keys of its own until max_tokens."""
    text, reason = ask(client, max_tokens=64, **fields)
    assert reason == "stop"
    check_shape(text)


def check_shape(text):
    value = json.loads(text)
    assert set(value) == {"color", "shape"}
    assert value["color"] in SHAPE_SCHEMA["properties"]["color"]["enum"]
    assert value["shape"] in SHAPE_SCHEMA["properties"]["shape"]["enum"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_of_n_sampled_answers_follows_the_schema_alone(client, stream):
    """n=2 at temperature 1: each answer has its own grammar state (a shared one would see both
    answers' tokens and break), and answer j is what n=1 with seed 11 + j gives."""
    answer = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), n=2,
                                            temperature=1.0, seed=11, max_tokens=64, stream=stream,
                                            response_format=RESPONSE_FORMAT)
    texts, reasons = ["", ""], [None, None]
    for chunk in (answer if stream else [answer]):
        for choice in chunk.choices:
            texts[choice.index] += (choice.delta.content or "") if stream else choice.message.content
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert reasons == ["stop", "stop"]
    for text in texts:
        check_shape(text)
    alone = [client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), temperature=1.0,
                                            seed=11 + j, max_tokens=64, response_format=RESPONSE_FORMAT)
             for j in range(2)]
    assert texts == [a.choices[0].message.content for a in alone]


def test_streamed_and_whole_structured_answers_agree(client):
    assert ask(client, False, max_tokens=64, response_format=RESPONSE_FORMAT) == \
        ask(client, True, max_tokens=64, response_format=RESPONSE_FORMAT)


def test_max_tokens_mid_object_finishes_with_length(client):
    text, reason = ask(client, max_tokens=4, response_format=RESPONSE_FORMAT)
    assert reason == "length" and text.startswith("{")
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("extra, check", [
    ({"choice": ["orange", "blue"]}, lambda text: text in ("orange", "blue")),
    ({"regex": "(It is|The shape is) [a-z]+\\."}, lambda text: re.fullmatch(r"(It is|The shape is) [a-z]+\.", text)),
    ({"json": SHAPE_SCHEMA}, lambda text: set(json.loads(text)) == {"color", "shape"}),
    ({"grammar": 'root ::= "Answer: " ("yes" | "no")'}, lambda text: text in ("Answer: yes", "Answer: no")),
], ids=["choice", "regex", "json", "grammar"])
def test_vllm_structured_outputs_through_extra_body(client, extra, check):
    text, reason = ask(client, max_tokens=48, extra_body={"structured_outputs": extra})
    assert reason == "stop" and check(text), text


def test_json_object_gives_an_object_or_stops_for_length(client):
    text, reason = ask(client, max_tokens=48, response_format={"type": "json_object"})
    assert text.startswith("{")
    if reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_a_plain_text_response_format_changes_nothing(client):
    assert ask(client, max_tokens=16, response_format={"type": "text"}) == ask(client, max_tokens=16)


def test_the_completions_route_takes_structured_outputs_too(client):
    answer = client.completions.create(model="llava-tiny", prompt="USER: Is the sky blue? ASSISTANT:",
                                       max_tokens=8, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert answer.choices[0].text in ("yes", "no") and answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "objekt"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "allowed: text, json_object, json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty list"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs",
     "not both"),
    ({"logit_bias": {"abc": 1}}, "logit_bias.abc", "token id"),
    ({"logit_bias": {"5": 150}}, "logit_bias[5]", "[-100, 100]"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"stop_token_ids": [99999999]}, "stop_token_ids", "outside the vocabulary"),
])
def test_bad_fields_are_400_naming_them(llava_server, body, param, fragment):
    answer = httpx.post(f"{llava_server.base}/v1/chat/completions", timeout=60, json={
        "model": "llava-tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **body})
    assert answer.status_code == 400, answer.text
    assert error(answer)["param"] == param and fragment in error(answer)["message"]


def test_logit_bias_bans_a_token(client):
    from transformers import AutoTokenizer

    from appliance.protocol.openai_responses import token_decoder
    from tests.servers import LLAVA_TINY

    plain = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=6,
                                           temperature=0, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    tokenizer = AutoTokenizer.from_pretrained(LLAVA_TINY)
    decode = token_decoder(tokenizer)  # token texts as the server names them
    same_text = [i for i in range(len(tokenizer)) if decode(i) == first]
    assert same_text
    banned = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=6,
                                            temperature=0, logprobs=True,
                                            logit_bias={str(i): -100 for i in same_text})
    assert banned.choices[0].logprobs.content[0].token != first


def test_developer_messages_and_extra_message_keys_are_taken(client):
    messages = [{"role": "developer", "content": "Answer briefly."}, *image_question(data_url())]
    messages[-1] = {**messages[-1], "name": "ana", "tool_calls": None, "refusal": None}
    answer = client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=16, temperature=0)
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")
