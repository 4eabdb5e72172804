"""`/tokenize` and `/detokenize` bodies checked by their pydantic models (appliance/protocol/tokenize.py),
in-process: vLLM's fields and defaults, errors that name the field first."""
import pytest

from appliance.errors import InputError
from appliance.protocol.tokenize import TokenizeChatBody, parse_detokenize, parse_tokenize

CHAT = [{"role": "user", "content": "hi"}]


def test_text_and_chat_bodies_take_vllms_defaults():
    text = parse_tokenize({"model": "m", "prompt": "Hello"})
    assert (text.prompt, text.messages, text.add_special_tokens, text.return_token_strs) == ("Hello", None, True,
                                                                                             False)
    chat = parse_tokenize({"messages": CHAT, "return_token_strs": True})
    assert (chat.messages, chat.prompt, chat.add_generation_prompt, chat.continue_final_message) == (CHAT, None,
                                                                                                  True, False)
    assert chat.add_special_tokens is None and chat.return_token_strs  # None: as a chat completion encodes
    assert parse_tokenize({"messages": CHAT, "add_special_tokens": False}).add_special_tokens is False
    # continue_final_message alone turns the generation prompt's default off (the two exclude each other)
    cont = parse_tokenize({"messages": [*CHAT, {"role": "assistant", "content": "It is"}],
                           "continue_final_message": True})
    assert (cont.continue_final_message, cont.add_generation_prompt) == (True, False)
    assert parse_detokenize({"model": "m", "tokens": [1, 2, 3]}).tokens == [1, 2, 3]
    assert parse_detokenize({"tokens": []}).tokens == []
    # JSON Schema's integers include 4.0 (schemathesis sends them so): taken as 4, as every integer field
    detokenized = parse_detokenize({"tokens": [32938.0, 2]}).tokens
    assert detokenized == [32938, 2] and all(type(token) is int for token in detokenized)


@pytest.mark.parametrize("parse, body, param, fragment", [
    (parse_tokenize, {}, "prompt", "prompt: required, a string (or send messages for a chat)"),
    (parse_tokenize, {"prompt": 3}, "prompt", "expected a string"),
    (parse_tokenize, {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens", "got 'yes'"),
    (parse_tokenize, {"prompt": "x", "temperature": 1}, "temperature",
     "unknown field; allowed: add_special_tokens, model, prompt"),
    (parse_tokenize, {"prompt": "x", "model": 3}, "model", "got 3"),
    (parse_tokenize, {"messages": []}, "messages", "non-empty list"),
    (parse_tokenize, {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'robot'"),
    (parse_tokenize, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].image_url", "required"),
    (parse_tokenize, {"messages": CHAT, "prompt": "x"}, "prompt",
     "unknown field; allowed: add_generation_prompt, add_special_tokens, continue_final_message, messages, model"),
    (parse_tokenize, {"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True},
     "continue_final_message", "set one of them false"),
    (parse_tokenize, [1], None, "body: expected a JSON object"),
    (parse_detokenize, {}, "tokens", "tokens: required, a list of token ids"),
    (parse_detokenize, {"tokens": [1, -2]}, "tokens", "got -2"),
    (parse_detokenize, {"tokens": [1, "2"]}, "tokens", "got '2'"),    # strict: no coercion
    (parse_detokenize, {"tokens": [1.5]}, "tokens", "got 1.5"),
    (parse_detokenize, {"tokens": "1 2"}, "tokens", "a list of token ids"),
])
def test_bad_bodies_name_the_field(parse, body, param, fragment):
    with pytest.raises(InputError) as info:
        parse(body)
    assert info.value.param == param and fragment in str(info.value), str(info.value)
    if param:
        assert str(info.value).startswith(f"{param}: ")


def test_the_openapi_schema_is_the_models():
    schema = TokenizeChatBody.model_json_schema()
    assert schema["required"] == ["messages"] and schema["additionalProperties"] is False
    assert schema["properties"]["add_generation_prompt"]["default"] is True
