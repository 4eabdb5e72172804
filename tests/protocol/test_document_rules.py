"""A rule the server enforces is in the document: for each body of the table, the request model's JSON
schema (what `/openapi.json` shows) and the parser (what the server does) both accept it or both refuse
it, and as the table says."""
import jsonschema
import pytest

from appliance.errors import InputError
from appliance.protocol.openai_models import ChatCompletionRequest
from appliance.protocol.openai_requests import parse_chat

CALL = {"id": "c1", "type": "function", "function": {"name": "paint", "arguments": "{}"}}


def chat(*messages):
    return {"messages": list(messages)}


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
}


def parses(parse, body) -> bool:
    try:
        parse(body)
    except InputError:
        return False
    return True


@pytest.mark.parametrize("model, parse, body, accepted", CASES.values(), ids=CASES.keys())
def test_the_schema_and_the_parser_agree(model, parse, body, accepted):
    schema = model.model_json_schema()
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == accepted
    assert parses(parse, body) == accepted
