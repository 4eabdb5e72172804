"""OpenAI chat completion and completion request bodies as pydantic models: the one definition that
validates requests (protocol/openai_requests.py turns them into a `GenerateRequest`) and that the server's
OpenAPI document shows (serving/http/openapi.py).

Tool calling (`tools`, `tool_choice`, `parallel_tool_calls`, tool messages) lives in openai_tools.py.
Beyond OpenAI, as vLLM: `top_k`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `structured_outputs`,
`stream_options.continuous_usage_stats`, `use_beam_search` with `length_penalty`. Fields OpenAI clients
send that the engine does not apply are accepted only at their neutral value. Unknown fields are refused;
unknown keys inside a message are ignored, as vLLM does.
"""
import json
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from typing_extensions import Annotated

from appliance.engine.structured_output import StructuredOutput, json_object
from appliance.protocol import openai_tools
from appliance.protocol.openai_tools import Tool, ToolCalling, ToolCalls, ToolChoice
from appliance.protocol.openai_fields import (LENIENT, STRICT, Integer, Integral, JsonSchema, Neutral, Number,
                                              OneOrList, Text, TokenId, engine_range, member, picked_by)
from appliance.protocol.strict_schema import strict_schema
from appliance.protocol.validation import field_error

# developer: OpenAI's name for system in newer models
Role = Literal["system", "developer", "user", "assistant", "tool"]
PART_TYPES = ("text", "image_url")
MAX_LOGPROBS = 20  # as vLLM's default max_logprobs
MAX_CHOICES = 128
# Fields beam search does not apply (it ranks whole answers by their logprobs, not token by token):
# refused with it rather than ignored.
NOT_WITH_BEAM_SEARCH = ("stop", "stop_token_ids", "min_tokens", "logit_bias", "response_format",
                        "structured_outputs", "logprobs", "top_logprobs", "echo", "tools")


# ---- messages ------------------------------------------------------------------------------------

class ImageURL(BaseModel):
    model_config = LENIENT
    url: Text = Field(description="a data:image/...;base64 URL, an http(s) URL or a path inside the server's "
                                  "allowed media directory")


class TextPart(BaseModel):
    model_config = LENIENT
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    model_config = LENIENT
    type: Literal["image_url"]
    image_url: Annotated[Union[Annotated[ImageURL, member("object")],
                               Annotated[Text, member("url")]],  # the bare string some clients send
                         picked_by(lambda v: "object" if isinstance(v, dict) else "url" if isinstance(v, str)
                                   else None)]


def _known_part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") not in PART_TYPES:
        raise field_error(f"{part.get('type')!r}; allowed: {', '.join(PART_TYPES)}", "type")
    return part


Part = Annotated[Union[Annotated[TextPart, member("text")], Annotated[ImagePart, member("image_url")]],
                 picked_by(lambda v: v.get("type") if isinstance(v, dict) else "text"), BeforeValidator(_known_part)]


NULL: JsonSchema = {"type": "null"}  # a property absent or null
GIVEN: JsonSchema = {"not": {"type": "null"}}  # a property present, not null


def _role(*roles: str, required=(), **properties: Any) -> JsonSchema:
    return {"properties": {"role": {"enum": list(roles)}, **properties}, "required": ["role", *required]}


class Message(BaseModel):
    # `_complete`'s rules, for the document: a message has content, but an assistant's with tool calls; only
    # an assistant's carries calls; a tool's answers a call, in text.
    model_config = ConfigDict(**LENIENT, json_schema_extra={"anyOf": [
        _role("system", "developer", "user", required=["content"], content=GIVEN, tool_calls=NULL),
        _role("assistant", required=["content"], content=GIVEN),
        _role("assistant", required=["tool_calls"], tool_calls={"type": "array"}),
        _role("tool", required=["content", "tool_call_id"], tool_calls=NULL, tool_call_id={"type": "string"},
              content={"anyOf": [{"type": "string"}, {"type": "array", "items": {
                  "properties": {"type": {"const": "text"}}}}]}),
    ]})
    role: Role
    content: Optional[OneOrList[str, Annotated[List[Part], Field(min_length=1)]]] = None
    tool_calls: Optional[ToolCalls] = Field(default=None, description="an assistant message's calls (its "
                                                                      "content may then be null)")
    tool_call_id: Optional[Text] = Field(default=None, description="a tool message: the call it answers")

    @model_validator(mode="after")
    def _complete(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise field_error("required, a string or a non-empty list of parts", "content")
        if self.tool_calls is not None and self.role != "assistant":
            raise field_error(f"only an assistant message carries tool calls, not a {self.role} message",
                              "tool_calls")
        if self.role == "tool":
            if self.tool_call_id is None:
                raise field_error("required in a tool message: the id of the tool call it answers", "tool_call_id")
            if isinstance(self.content, list) and any(part.type != "text" for part in self.content):
                raise field_error("a tool message takes text only", "content")
        return self


# ---- fields both routes take ---------------------------------------------------------------------

class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: Optional[bool] = None
    continuous_usage_stats: Optional[bool] = Field(default=None, description="usage on every chunk (with "
                                                                             "include_usage)")


class JsonSchemaFormat(BaseModel):
    model_config = LENIENT
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Dict[str, Any] = Field(alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    # `_schema_given`, for the document
    model_config = ConfigDict(**LENIENT, json_schema_extra={"anyOf": [
        {"properties": {"type": {"enum": ["text", "json_object"]}}},
        {"properties": {"type": {"const": "json_schema"}, "json_schema": GIVEN}, "required": ["json_schema"]}]})
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise field_error("required, an object {name, schema, strict} whose schema is a JSON schema object",
                              "json_schema")
        return self


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar."""
    model_config = ConfigDict(**LENIENT, json_schema_extra={"oneOf": [  # `_one_kind`, for the document
        {"properties": {kind: GIVEN}, "required": [kind]} for kind in STRUCTURED_KINDS]})
    json_: Optional[Annotated[Union[Annotated[str, member("text")], Annotated[Dict[str, Any], member("object")]],
                              picked_by(lambda v: "text" if isinstance(v, str) else "object" if isinstance(v, dict)
                                        else None)]] = Field(default=None, alias="json")
    regex: Optional[Text] = None
    choice: Optional[Annotated[List[str], Field(min_length=1)]] = None
    grammar: Optional[Text] = Field(default=None, description="a Lark or EBNF grammar, as llguidance reads it")

    @model_validator(mode="after")
    def _one_kind(self):
        given = [kind for kind, value in self.specs().items() if value is not None]
        if len(given) != 1:
            raise field_error(f"give exactly one of json, regex, choice, grammar (got {', '.join(given) or 'none'})")
        return self

    def specs(self) -> Dict[str, Any]:
        return dict(zip(STRUCTURED_KINDS, (self.json_, self.regex, self.choice, self.grammar)))


Bias = Annotated[Number, engine_range(minimum=-100, maximum=100)]
Seed = Integral[Annotated[int, Field(ge=-2 ** 63, le=2 ** 63 - 1)]]
Logprobs = Integral[Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]]
Unapplied = Annotated[Optional[Number], Neutral(0, "the engine does not apply it")]


TOKEN_KEY = r"^[0-9]+$"  # a logit_bias key: a token id in decimal


def _either_absent(*names: str) -> JsonSchema:
    """At most one of `names` given (not null)."""
    return {"anyOf": [{"properties": {name: NULL}} for name in names]}


def _only_with(name: str, value: Any, needs: str, needed: Any) -> JsonSchema:
    """`name` at `value` (absent or null: its neutral value) unless `needs` is `needed`."""
    return {"anyOf": [{"properties": {name: value}}, {"properties": {needs: {"const": needed}}, "required": [needs]}]}


NEUTRAL: JsonSchema = {"enum": [None, False, 0]}  # what `_beam_search` counts as not given
# `GenerateBody._beam_search`'s and `_consistent`'s rules, for the document
GENERATE_RULES: List[JsonSchema] = [
    _only_with("stream_options", NULL, "stream", True),
    _either_absent("response_format", "structured_outputs"),
    _only_with("length_penalty", {"const": 1.0}, "use_beam_search", True),
    {"anyOf": [{"properties": {"use_beam_search": {"not": {"const": True}}}},
               {"properties": {name: NEUTRAL for name in NOT_WITH_BEAM_SEARCH}}]},
]


class GenerateBody(BaseModel):
    """What chat completions and completions share."""
    model_config = ConfigDict(**STRICT, json_schema_extra={"allOf": list(GENERATE_RULES)})

    model: Optional[str] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    n: Optional[Integral[Annotated[int, Field(ge=1, le=MAX_CHOICES)]]] = Field(
        default=1, description="answers (choices) to the request")
    max_tokens: Optional[Annotated[Integer, engine_range(minimum=1)]] = None
    max_completion_tokens: Optional[Annotated[Integer, engine_range(minimum=1)]] = None
    temperature: Optional[Annotated[Number, engine_range(minimum=0)]] = None
    top_p: Optional[Annotated[Number, engine_range(exclusiveMinimum=0, maximum=1)]] = None
    top_k: Optional[Annotated[Integer, engine_range(minimum=0)]] = Field(default=None, description="0: all tokens")
    min_tokens: Optional[Annotated[Integer, engine_range(minimum=0)]] = None
    seed: Optional[Seed] = None
    stop: Optional[OneOrList[Text, List[Text]]] = Field(
        default=None, description="strings that end the answer (not empty)")
    stop_token_ids: Optional[List[TokenId]] = None
    ignore_eos: Optional[bool] = None
    logit_bias: Optional[Annotated[Dict[Annotated[str, Field(pattern=TOKEN_KEY)], Bias],
                                   Field(json_schema_extra={"additionalProperties": False})]] = Field(
        default=None, description="token id (decimal) -> bias added to its logit")
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    frequency_penalty: Unapplied = None
    presence_penalty: Unapplied = None
    use_beam_search: Optional[bool] = Field(default=None, description="beam search of width n (vLLM's): the n "
                                            "best answers, best first; temperature, top_p, top_k and seed "
                                            "are ignored")
    length_penalty: Number = Field(default=1.0, description="beam search: answers rank by cumulative logprob / "
                                                            "(tokens, prompt included) ** length_penalty; 1.0 "
                                                            "unless use_beam_search")

    @model_validator(mode="after")
    def _beam_search(self):
        if not self.use_beam_search:
            if self.length_penalty != 1.0:
                raise field_error(f"{self.length_penalty}; only with use_beam_search: true", "length_penalty")
            return self
        for name in NOT_WITH_BEAM_SEARCH:
            if getattr(self, name, None) not in (None, False):
                raise field_error("not with use_beam_search: beam search ranks whole answers by their logprobs",
                                  name)
        return self

    @model_validator(mode="after")
    def _consistent(self):
        if self.stream_options is not None and not self.stream:
            raise field_error("only allowed with stream: true", "stream_options")
        if self.response_format is not None and self.structured_outputs is not None:
            raise field_error("give response_format or structured_outputs, not both", "structured_outputs")
        structured = self.structured()
        if structured is not None:
            try:
                structured.check()
            except ValueError as e:  # a grammar that cannot compile: refused here, naming the field
                raise field_error(str(e), "response_format" if self.response_format else "structured_outputs") from e
        return self

    def structured(self) -> Optional[StructuredOutput]:
        """`response_format` or `structured_outputs` as one StructuredOutput (None: free text)."""
        if self.response_format is not None:
            kind = self.response_format.type
            if kind == "json_object":
                return json_object()
            json_schema = self.response_format.json_schema  # given with json_schema: `_schema_given`
            if kind == "json_schema" and json_schema is not None:
                return StructuredOutput("json", json.dumps(strict_schema(json_schema.schema_)))
            return None
        if self.structured_outputs is not None:
            spec_kind, spec = next((k, v) for k, v in self.structured_outputs.specs().items() if v is not None)
            if spec_kind == "json":  # a schema, as an object or as JSON text (text that is not JSON: grammar() says so)
                spec = strict_schema(_json_or_text(spec))
            return StructuredOutput(spec_kind, spec if isinstance(spec, str) else json.dumps(spec))
        return None


class ChatCompletionRequest(GenerateBody):
    model_config = ConfigDict(**STRICT, json_schema_extra={"allOf": [  # `_top_needs_logprobs`, for the document
        *GENERATE_RULES, _only_with("top_logprobs", NULL, "logprobs", True)]})
    messages: Annotated[List[Message], Field(min_length=1)]
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Logprobs] = None
    tools: Optional[List[Tool]] = Field(default=None, description="functions the model may call (docs/serving.md)")
    tool_choice: Optional[ToolChoice] = Field(default=None, description='"none", "auto" (the default with tools; '
                                              'needs model.tool_call_parser), "required" or a named function')
    parallel_tool_calls: Optional[bool] = Field(default=None, description="false: at most one call, in every "
                                                                          "tool_choice; default true")

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise field_error("needs logprobs: true", "top_logprobs")
        return self

    @model_validator(mode="after")
    def _tools_servable(self):
        constrained = self.response_format is not None and self.response_format.type != "text" \
            or self.structured_outputs is not None
        openai_tools.check(self.tools, self.tool_choice, self.tool_calling(), constrained)
        return self

    def tool_calling(self) -> Optional[ToolCalling]:
        """What the answer holds (None: text): openai_tools.py."""
        return openai_tools.tool_calling(self.tools, self.tool_choice, self.model_fields_set, self.parallel_tool_calls)

    def tool_constraint(self) -> Optional[StructuredOutput]:
        """The grammar of a named or required tool choice (None: none)."""
        return openai_tools.constraint(self.tools or [], self.tool_calling())


def _json_or_text(spec: Any) -> Any:
    if not isinstance(spec, str):
        return spec
    try:
        return json.loads(spec)
    except ValueError:
        return spec


def _prompt_kind(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else None
    return "texts" if isinstance(first, str) else "token_id_lists" if isinstance(first, list) else "token_ids"


TokenIds = Annotated[List[TokenId], Field(min_length=1)]
Prompt = Annotated[Union[Annotated[Text, member("text")], Annotated[TokenIds, member("token_ids")],
                         Annotated[Annotated[List[Text], Field(min_length=1)], member("texts")],
                         Annotated[Annotated[List[TokenIds], Field(min_length=1)], member("token_id_lists")]],
                   picked_by(_prompt_kind)]


class CompletionRequest(GenerateBody):
    prompt: Prompt = Field(description="a prompt (text or token ids) or a list of prompts")
    logprobs: Optional[Logprobs] = Field(
        default=None, description="the sampled token's logprob plus the top N")
    echo: Optional[bool] = Field(default=False, description="the prompt before the answer")
    best_of: Optional[Integral[Annotated[int, Field(ge=1)]]] = Field(default=None, description="1 or n only")
    suffix: Annotated[Optional[str], Neutral("", "the engine does not insert text")] = None

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.use_beam_search and self.best_of not in (None, self.n):
            raise field_error(f"{self.best_of}; with use_beam_search the beam width is n ({self.n}): give best_of "
                              f"= n or leave it out", "best_of")
        if self.best_of not in (None, 1, self.n):
            raise field_error(f"{self.best_of}; allowed: 1 or n ({self.n}): every candidate is an answer",
                              "best_of")
        return self

    def prompts(self) -> List[Any]:
        """The prompts, each a string or a list of token ids (a list of one behaves as one prompt)."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)
