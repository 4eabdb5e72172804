"""The answer models (appliance/protocol) against the bodies the server builds, in-process: every body
the builders make validates, and a field more or a field less is refused, so the models and the
builders cannot drift apart unnoticed. (tests/serving/test_answer_models.py checks a real server's.)"""
import json
from typing import get_args

import pytest
from pydantic import ValidationError

from appliance.protocol import openai_responses as shape
from appliance.protocol.openai_answers import (ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk,
                                               ErrorResponse)
from appliance.protocol.pooling import PoolingResponse, pooling_response
from appliance.protocol.tokenize import (DetokenizeResponse, TokenizeResponse, detokenize_response,
                                         tokenize_response)

ID, MODEL, CREATED = "chatcmpl-1", "llava-tiny", 1700000000
LOGPROBS = [shape.TokenLogprob(" red", -0.25, ((" red", -0.25), (" blue", -1.5))),
            shape.TokenLogprob("é", -2.0, (("é", -2.0),))]
PROMPT_LOGPROBS = [shape.TokenLogprob("<s>", None, ()), *LOGPROBS]  # as `echo` with logprobs answers
USAGE = shape.usage(12, 2)


def choices(logprobs=None):
    return [shape.Choice(1, " blue", "length", logprobs), shape.Choice(0, " red", "stop", logprobs)]


ANSWERS = [
    ("chat", ChatCompletion, shape.chat_completion(ID, MODEL, CREATED, choices(), USAGE)),
    ("chat logprobs", ChatCompletion, shape.chat_completion(ID, MODEL, CREATED, choices(LOGPROBS), USAGE)),
    ("chat role chunk", ChatCompletionChunk,
     shape.chat_chunk(ID, MODEL, CREATED, 0, {"role": "assistant", "content": ""})),
    ("chat chunk", ChatCompletionChunk, shape.chat_chunk(ID, MODEL, CREATED, 2, {"content": " red"}, "stop",
                                                         LOGPROBS, usage_=None)),
    ("chat continuous usage", ChatCompletionChunk,
     shape.chat_chunk(ID, MODEL, CREATED, 0, {"content": " red"}, usage_=USAGE)),
    ("chat usage chunk", ChatCompletionChunk, shape.usage_chunk("chat", ID, MODEL, CREATED, USAGE)),
    ("completion", Completion, shape.text_completion(ID, MODEL, CREATED, choices(), USAGE)),
    ("completion echo logprobs", Completion,
     shape.text_completion(ID, MODEL, CREATED, choices(PROMPT_LOGPROBS), USAGE)),
    ("completion chunk", CompletionChunk, shape.text_chunk(ID, MODEL, CREATED, 0, " red", "stop", LOGPROBS, 5,
                                                           usage_=USAGE)),
    ("completion usage chunk", CompletionChunk, shape.usage_chunk("completion", ID, MODEL, CREATED, USAGE)),
    *[(f"error {status}", ErrorResponse, shape.error_body(status, "what was wrong", param))
      for status, param in ((400, "messages.0.content"), (404, None), (415, None), (429, None), (502, None),
                            *((status, None) for status in shape.ERROR_TYPES))],
    ("tokenize", TokenizeResponse, tokenize_response([1, 2, 3], 4096, None)),
    ("tokenize strs", TokenizeResponse, tokenize_response([1, 29871], 4096, ["<s>", "▁"])),
    ("detokenize", DetokenizeResponse, detokenize_response("Hi")),
    ("pooling", PoolingResponse, pooling_response("pool-1", "b64_json", "SUkqAA==")),
]
CASES = [pytest.param(model, body, id=name) for name, model, body in ANSWERS]


def wire(body):
    """The body as a client reads it (the server sends JSON)."""
    return json.loads(json.dumps(body))


@pytest.mark.parametrize("model,body", CASES)
def test_every_body_the_server_builds_is_its_model(model, body):
    model.model_validate(wire(body))


@pytest.mark.parametrize("model,body", CASES)
def test_a_field_more_is_refused(model, body):
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.model_validate({**wire(body), "extra": 1})


@pytest.mark.parametrize("model,body", CASES)
def test_a_field_less_is_refused(model, body):
    for field in (name for name, info in model.model_fields.items() if info.is_required()):
        short = {k: v for k, v in wire(body).items() if k != field}
        with pytest.raises(ValidationError, match="Field required"):
            model.model_validate(short)


def test_nested_fields_are_checked_too():
    body = wire(shape.chat_completion(ID, MODEL, CREATED, choices(LOGPROBS), USAGE))
    body["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["rank"] = 1
    with pytest.raises(ValidationError, match="rank"):
        ChatCompletion.model_validate(body)
    body = wire(shape.text_completion(ID, MODEL, CREATED, choices(LOGPROBS), USAGE))
    del body["choices"][0]["logprobs"]["text_offset"]
    with pytest.raises(ValidationError, match="text_offset"):
        Completion.model_validate(body)
    with pytest.raises(ValidationError, match="type"):
        ErrorResponse.model_validate({"error": {"message": "m", "type": "Nope", "param": None, "code": 400}})


def test_the_error_types_documented_are_those_a_status_answers():
    """The schema's enum of error types lists no type the server never sends (mypy checks the converse)."""
    assert set(get_args(shape.ErrorType)) == set(shape.ERROR_TYPES.values())
