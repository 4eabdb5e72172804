"""OpenAI answer bodies as pydantic models: what `/v1/chat/completions` and `/v1/completions` answer
(whole, or streamed chunk by chunk), what `/v1/models` answers, and every error. The server's OpenAPI
document generates its answer schemas from them (serving/http/openapi.py) and the tests validate real
answers with them (`/pooling`'s and `/tokenize`'s live beside their requests: pooling.py, tokenize.py).

The answers themselves are plain dicts built by `openai_responses` and serialized as they are: no
model is built per request (the HTTP process's time per request and per streamed token matters).
So these models are the answers' description, held true by the tests: every field the server always
sends is required (nullable where it sends null), a field it sends only sometimes has a default, and
unknown fields are refused, so a drift either way fails a test. Names follow OpenAI's and vLLM's.
"""
from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Annotated

from appliance.protocol.openai_responses import ErrorType

ANSWER = ConfigDict(extra="forbid", strict=True)

Count = Annotated[int, Field(ge=0)]
Byte = Annotated[int, Field(ge=0, le=255)]
FinishReason = Optional[Literal["stop", "length", "tool_calls"]]  # null until a choice's last chunk


class Usage(BaseModel):
    model_config = ANSWER
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count


# ---- errors ------------------------------------------------------------------------------------

class ErrorInfo(BaseModel):
    model_config = ANSWER
    message: str = Field(description="what was wrong, naming the field, and how to fix it")
    type: ErrorType
    param: Optional[str] = Field(description="the field at fault (a path such as messages.0.content), or null")
    code: int = Field(description="the HTTP status")


class ErrorResponse(BaseModel):
    """Every error answer; inside a stream that has started, the same object as one event's data."""
    model_config = ANSWER
    error: ErrorInfo


# ---- chat completions --------------------------------------------------------------------------

class ChatCompletionLogprob(BaseModel):
    model_config = ANSWER
    token: str
    logprob: float
    bytes: List[Byte] = Field(description="the token's text as UTF-8")


class ChatCompletionTokenLogprob(ChatCompletionLogprob):
    top_logprobs: List[ChatCompletionLogprob] = Field(description="the top_logprobs most likely tokens, most "
                                                                  "likely first")


class ChatCompletionLogprobs(BaseModel):
    model_config = ANSWER
    content: List[ChatCompletionTokenLogprob]


class ChatCompletionFunctionCall(BaseModel):
    model_config = ANSWER
    name: str
    arguments: str = Field(description="the arguments as JSON text, as the model wrote them")


class ChatCompletionToolCall(BaseModel):
    model_config = ANSWER
    id: str
    type: Literal["function"]
    function: ChatCompletionFunctionCall


class ChatCompletionMessage(BaseModel):
    model_config = ANSWER
    role: Literal["assistant"]
    content: Optional[str] = Field(description="null in an answer that is only tool calls")
    tool_calls: Optional[List[ChatCompletionToolCall]] = Field(default=None,
                                                               description="only in an answer that calls tools")


class ChatCompletionChoice(BaseModel):
    model_config = ANSWER
    index: Count
    message: ChatCompletionMessage
    logprobs: Optional[ChatCompletionLogprobs]
    finish_reason: FinishReason


class AnswerBase(BaseModel):
    """What every completion answer and chunk starts with."""
    model_config = ANSWER
    id: str
    created: int
    model: str


class ChatCompletion(AnswerBase):
    object: Literal["chat.completion"]
    choices: List[ChatCompletionChoice] = Field(min_length=1, description="in index order")
    usage: Usage


class ChatCompletionDeltaFunction(BaseModel):
    model_config = ANSWER
    name: Optional[str] = Field(default=None, description="in the call's first delta only")
    arguments: str = Field(description='"" in the first delta, then the next piece of the arguments')


class ChatCompletionDeltaToolCall(BaseModel):
    model_config = ANSWER
    index: Count = Field(description="which call of the answer (from 0)")
    id: Optional[str] = Field(default=None, description="in the call's first delta only")
    type: Optional[Literal["function"]] = Field(default=None, description="in the call's first delta only")
    function: ChatCompletionDeltaFunction


class ChatCompletionDelta(BaseModel):
    model_config = ANSWER
    role: Optional[Literal["assistant"]] = Field(default=None, description="in each choice's first chunk only")
    content: Optional[str] = Field(default=None, description="new text; absent from tool-call deltas and "
                                                             "from a tool-calling answer's last chunk")
    tool_calls: Optional[List[ChatCompletionDeltaToolCall]] = Field(
        default=None, description="one call's start or next arguments piece")


class ChatCompletionChunkChoice(BaseModel):
    model_config = ANSWER
    index: Count
    delta: ChatCompletionDelta
    logprobs: Optional[ChatCompletionLogprobs]
    finish_reason: FinishReason


class ChatCompletionChunk(AnswerBase):
    """One event of a streamed chat completion: one choice's new text, or (the last, with
    `stream_options.include_usage`) no choice and the usage."""
    object: Literal["chat.completion.chunk"]
    choices: List[ChatCompletionChunkChoice] = Field(max_length=1)
    usage: Optional[Usage] = Field(default=None, description="only with stream_options.include_usage: null, "
                                                             "or the counts so far with continuous_usage_stats; "
                                                             "always on the last chunk")


# ---- completions -------------------------------------------------------------------------------

class CompletionLogprobs(BaseModel):
    """The legacy format, one entry per token; a prompt's first token (with `echo`) has null logprobs."""
    model_config = ANSWER
    tokens: List[str]
    token_logprobs: List[Optional[float]]
    top_logprobs: List[Optional[Dict[str, float]]] = Field(description="the top N and the sampled token")
    text_offset: List[Count] = Field(description="where each token starts in the choice's text")


class CompletionChoice(BaseModel):
    model_config = ANSWER
    index: Count
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: FinishReason


class Completion(AnswerBase):
    object: Literal["text_completion"]
    choices: List[CompletionChoice] = Field(min_length=1, description="in index order")
    usage: Usage


class CompletionChunk(AnswerBase):
    """One event of a streamed completion: one choice's new text, or (the last, with
    `stream_options.include_usage`) no choice and the usage."""
    object: Literal["text_completion"]
    choices: List[CompletionChoice] = Field(max_length=1)
    usage: Optional[Usage] = Field(default=None, description="only with stream_options.include_usage, as in "
                                                             "a chat completion chunk")


# ---- models ------------------------------------------------------------------------------------

class ModelCard(BaseModel):
    model_config = ANSWER
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: Optional[str]


class ModelList(BaseModel):
    model_config = ANSWER
    object: Literal["list"]
    data: List[ModelCard]
