"""vLLM's `/tokenize` and `/detokenize` bodies, so clients that budget tokens against a vLLM server
work against ours unchanged:

    POST /tokenize   {"model"?, "prompt", "add_special_tokens"?: true, "return_token_strs"?: false}
                  or {"model"?, "messages", "add_generation_prompt"?: true, "continue_final_message"?: false,
                      "add_special_tokens"?, "return_token_strs"?: false}
      -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize {"model"?, "tokens"} -> {"prompt"}
    GET /tokenizer_info -> {"tokenizer_class", "chat_template"?, the tokenizer's settings: "bos_token",
                            "eos_token", "pad_token", "model_max_length", ...}

A body with `messages` is a chat (vLLM tells the two apart the same way). The chat's tokens are those a
chat completion with the same messages would run: images count as the placeholder tokens they expand
to. `add_special_tokens` left out of a chat means "as a chat completion does" (BOS unless the template
writes it); given, it is applied as asked. Like vLLM, tokenizing refuses no prompt for its length: the
answer carries `max_model_len` to compare against.

The pydantic models are the one definition of the bodies: they validate (strict: no type coercion, no
unknown field) and the server's OpenAPI document is generated from them (`serving/http/openapi.py`).
`TokenizeResponse`, `DetokenizeResponse` and `TokenizerInfoResponse` describe the answers (built as plain
dicts in the engine process), for the same document and for the tests that check real answers against them.

`/tokenizer_info` answers as vLLM's (behind its `--enable-tokenizer-info-endpoint`): the tokenizer's
`init_kwargs` as JSON (a special token as its text), its class and the chat template the server renders
with; lm-eval's `tokenizer_backend=remote` reads `eos_token`, `bos_token`, `pad_token` and
`chat_template` from it. File locations on the server are left out (vLLM drops `vocab_file` and
`merges_file`; we drop `name_or_path` too).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from appliance.errors import InputError
from appliance.protocol.openai_fields import TokenId as BodyTokenId  # 4.0 taken as 4
from appliance.protocol.openai_models import Message
from appliance.protocol.openai_requests import EXPECTED as REQUEST_EXPECTED
from appliance.protocol.validation import input_error

TokenId = Annotated[int, Field(ge=0)]  # in an answer


class TokenizeCompletionBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Optional[str] = None
    prompt: str = Field(description="the text to tokenize")
    add_special_tokens: bool = Field(default=True, description="add the tokenizer's special tokens (BOS), as a "
                                                               "completion request does")
    return_token_strs: Optional[bool] = Field(default=False, description="also answer each token's string")


class TokenizeChatBody(BaseModel):
    # `parse_tokenize`'s rule, for the document: the last message is continued or answered, not both
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"properties": {"continue_final_message": {"not": {"const": True}}}},
        {"properties": {"add_generation_prompt": {"not": {"const": True}}}}]})

    model: Optional[str] = None
    messages: List[Message] = Field(min_length=1, description="OpenAI chat messages, as /v1/chat/completions "
                                                              "takes them")
    add_generation_prompt: bool = Field(default=True, description="end with the assistant's turn opening")
    continue_final_message: bool = Field(default=False, description="leave the last message open, to be "
                                                                    "continued; not with add_generation_prompt")
    add_special_tokens: Optional[bool] = Field(default=None, description="left out: as a chat completion "
                                                                         "(BOS unless the template writes it)")
    return_token_strs: Optional[bool] = Field(default=False, description="also answer each token's string")


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Optional[str] = None
    tokens: List[BodyTokenId] = Field(description="token ids inside the model's vocabulary")


class TokenizeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    count: int = Field(ge=0)
    max_model_len: int = Field(ge=1, description="the context length, to compare count against")
    tokens: List[TokenId]
    token_strs: Optional[List[str]] = Field(description="each token's string, with return_token_strs; else null")


class DetokenizeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str


class TokenizerInfoResponse(BaseModel):
    """The tokenizer's settings; which keys there are besides `tokenizer_class` depends on the tokenizer."""
    model_config = ConfigDict(extra="allow")

    tokenizer_class: str = Field(description="the tokenizer's class name")
    chat_template: Optional[str] = Field(default=None, description="the Jinja chat template chats are rendered "
                                                                   "with (left out when there is none)")


# What an error says a field should be, where pydantic's own words would not help a client.
EXPECTED = {"prompt": "a string (or send messages for a chat)",
            "tokens": "a list of token ids (integers >= 0)",
            **{path: what for path, what in REQUEST_EXPECTED.items() if path.startswith("messages")}}


@dataclass
class TokenizeRequest:
    model: Optional[str]
    prompt: Optional[str] = None                       # a text, or
    messages: Optional[List[Dict[str, Any]]] = None    # a chat (validated OpenAI messages)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: Optional[bool] = None          # None: a chat's own rule
    return_token_strs: bool = False


def parse_tokenize(body: Any) -> TokenizeRequest:
    """A `/tokenize` body: a chat when it has `messages`, else a text `prompt`."""
    body = _object(body)
    if "messages" not in body:
        text = _validate(TokenizeCompletionBody, body)
        return TokenizeRequest(text.model, prompt=text.prompt, add_special_tokens=text.add_special_tokens,
                               return_token_strs=bool(text.return_token_strs))
    chat = _validate(TokenizeChatBody, body)
    messages = body["messages"]  # as sent, as a chat completion's: keys beyond role and content stay
    generation_prompt = chat.add_generation_prompt
    if chat.continue_final_message:
        if generation_prompt and "add_generation_prompt" in chat.model_fields_set:
            raise InputError("continue_final_message: true together with add_generation_prompt: true; the "
                             "last message is either continued or answered: set one of them false",
                             param="continue_final_message")
        generation_prompt = False  # its default gives way to an explicit continue_final_message
    return TokenizeRequest(chat.model, messages=messages, add_generation_prompt=generation_prompt,
                           continue_final_message=chat.continue_final_message,
                           add_special_tokens=chat.add_special_tokens,
                           return_token_strs=bool(chat.return_token_strs))


def parse_detokenize(body: Any) -> DetokenizeBody:
    return _validate(DetokenizeBody, _object(body))


def tokenize_response(tokens: List[int], max_model_len: int, token_strs: Optional[List[str]]) -> Dict[str, Any]:
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}


def detokenize_response(prompt: str) -> Dict[str, Any]:
    return {"prompt": prompt}


SERVER_PATHS = ("vocab_file", "merges_file", "name_or_path")  # where the tokenizer's files lie on the server


def tokenizer_info_response(tokenizer) -> Dict[str, Any]:
    """vLLM's `/tokenizer_info` answer for a Hugging Face tokenizer."""
    info = {key: _json_value(value) for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
            if key not in SERVER_PATHS}
    info["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    else:
        info.pop("chat_template", None)
    return info


def _json_value(value: Any) -> Any:
    """A setting as JSON: a special token (`AddedToken`) as its text, a mapping's keys as strings."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _object(body: Any) -> Dict[str, Any]:
    if not isinstance(body, dict):
        raise InputError(f"body: expected a JSON object, got {type(body).__name__}")
    return body


def _validate(model, body: Dict[str, Any]):
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise input_error(e, model, EXPECTED) from None
