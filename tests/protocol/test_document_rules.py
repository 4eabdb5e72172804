"""A rule the server enforces is in the document: for each body of the table, the request model's JSON
schema (what `/openapi.json` shows) and the parser (what the server does) both accept it or both refuse
it, and as the table says."""
from functools import partial

import jsonschema
import pytest

from appliance.errors import InputError
from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.openai_requests import parse_chat, parse_completion
from appliance.protocol.pooling import PoolingBody, parse_pooling
from appliance.protocol.scenes import OneDateSceneBody, SceneBody, parse_scene_body
from appliance.protocol.tokenize import TokenizeChatBody, parse_tokenize

CALL = {"id": "c1", "type": "function", "function": {"name": "paint", "arguments": "{}"}}


def chat(*messages, **fields):
    return {"messages": list(messages or [{"role": "user", "content": "Hi"}]), **fields}


def text(**fields):
    return (CompletionRequest, parse_completion, {"prompt": "Hi", **fields})


def pooling(data, data_format):
    return (PoolingBody, parse_pooling, {"data": {"data": data, "data_format": data_format}})


def indices(*given):
    body = {"data": {"data": "a.tif", "data_format": "path", "indices": list(given)}}
    return (PoolingBody, lambda sent: parse_pooling(sent).bands == [index + 1 for index in given], body)


def scene(**fields):  # as a two-date model's server reads it (a one-date model's refuses urls)
    return (SceneBody, partial(parse_scene_body, frames=2), fields)


def one_date_scene(**fields):
    return (OneDateSceneBody, partial(parse_scene_body, frames=1), fields)


# (model, parse, body, accepted)
CASES = {
    "a user message with text": (ChatCompletionRequest, parse_chat, chat({"role": "user", "content": "Hi"}), True),
    "a user message without content": (ChatCompletionRequest, parse_chat, chat({"role": "user"}), False),
    "a system message with null content": (ChatCompletionRequest, parse_chat,
                                           chat({"role": "system", "content": None}), False),
    "an assistant's tool calls, no content": (ChatCompletionRequest, parse_chat,
                                              chat({"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "tool_calls": [CALL]}), True),
    "an assistant message without content or calls": (ChatCompletionRequest, parse_chat,
                                                       chat({"role": "assistant", "content": None}), False),
    "a user message with tool calls": (ChatCompletionRequest, parse_chat,
                                       chat({"role": "user", "content": "Hi", "tool_calls": [CALL]}), False),
    "a tool message answering a call": (ChatCompletionRequest, parse_chat,
                                        chat({"role": "user", "content": "Hi"},
                                             {"role": "assistant", "tool_calls": [CALL]},
                                             {"role": "tool", "content": "done", "tool_call_id": "c1"}), True),
    "a tool message without its call's id": (ChatCompletionRequest, parse_chat,
                                             chat({"role": "tool", "content": "done"}), False),
    "a tool message with an image": (ChatCompletionRequest, parse_chat,
                                     chat({"role": "tool", "tool_call_id": "c1", "content": [
                                         {"type": "image_url", "image_url": "data:image/png;base64,AA=="}]}), False),
    "stream_options with stream": (*text(stream=True, stream_options={"include_usage": True}), True),
    "stream_options without stream": (*text(stream_options={"include_usage": True}), False),
    "response_format and structured_outputs": (*text(response_format={"type": "json_object"},
                                                     structured_outputs={"regex": "a"}), False),
    "structured_outputs of one kind": (*text(structured_outputs={"choice": ["a", "b"]}), True),
    "structured_outputs of two kinds": (*text(structured_outputs={"regex": "a", "choice": ["a"]}), False),
    "structured_outputs of none": (*text(structured_outputs={"regex": None}), False),
    "json_schema without its schema": (*text(response_format={"type": "json_schema"}), False),
    "json_schema with its schema": (*text(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}), True),
    "an empty stop string": (*text(stop=""), False),
    "an empty stop string in a list": (*text(stop=["a", ""]), False),
    "a logit_bias key that is no token id": (*text(logit_bias={"a": 1}), False),
    "a logit_bias key that is a token id": (*text(logit_bias={"12": 1}), True),
    "length_penalty without beam search": (*text(length_penalty=0.5), False),
    "length_penalty with beam search": (*text(use_beam_search=True, length_penalty=0.5), True),
    "stop with beam search": (*text(use_beam_search=True, stop="x"), False),
    "min_tokens 0 with beam search": (*text(use_beam_search=True, min_tokens=0), True),
    "top_logprobs without logprobs": (ChatCompletionRequest, parse_chat, chat(top_logprobs=2), False),
    "top_logprobs with logprobs": (ChatCompletionRequest, parse_chat, chat(top_logprobs=2, logprobs=True), True),
    "a URL with data_format url": (*pooling("HTTPS://example.org/a.tif", "url"), True),
    "an s3 URL with data_format url": (*pooling("s3://bucket/a.tif", "url"), True),
    "a file name with data_format url": (*pooling("a.tif", "url"), False),
    "a file name with data_format path": (*pooling("a.tif", "path"), True),
    "band indices written 2.0": (*indices(0, 2.0), True),
    "a band index 1.5": (*indices(0, 1.5), False),
    "a scene's url": (*scene(url="https://example.org/a.tif"), True),
    "a scene's urls": (*scene(urls=["https://example.org/a.tif", "https://example.org/b.tif"]), True),
    "a scene's url and urls": (*scene(url="https://example.org/a.tif", urls=["https://example.org/b.tif"]), False),
    "a scene with neither url nor urls": (*scene(date="2024-06-30"), False),
    "a one-date scene's url": (*one_date_scene(url="https://example.org/a.tif"), True),
    "a one-date scene's urls": (*one_date_scene(urls=["https://example.org/a.tif"]), False),
    "a one-date scene's null url": (*one_date_scene(url=None), False),
    "a one-date scene with neither": (*one_date_scene(date="2024-06-30"), False),
    "a chat continued": (TokenizeChatBody, parse_tokenize, chat(continue_final_message=True), True),
    "a chat continued and answered": (TokenizeChatBody, parse_tokenize,
                                      chat(continue_final_message=True, add_generation_prompt=True), False),
}


def parses(parse, body) -> bool:
    """True when `parse` takes the body (a parse that checks what it made returns False when that is wrong)."""
    try:
        return parse(body) is not False
    except InputError:
        return False


@pytest.mark.parametrize("model, parse, body, accepted", CASES.values(), ids=CASES.keys())
def test_the_schema_and_the_parser_agree(model, parse, body, accepted):
    schema = model.model_json_schema()
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == accepted
    assert parses(parse, body) == accepted
