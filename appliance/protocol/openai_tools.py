"""Tool calling in a chat completion request, as OpenAI and vLLM take it: `tools` (function definitions
whose parameters are a JSON schema), `tool_choice`, `parallel_tool_calls`, and the tool calls an
assistant message carries back in a conversation.

`ToolCalling` is what the request asks of its answer; named and required choices also constrain the
sampler (`constraint`), as vLLM does through its structured-output engine:
- a named function: the answer is that function's arguments, a JSON object of its parameters schema;
- `required`: a JSON array of `{"name": <a tool>, "parameters": <that tool's arguments>}` objects, at
  least one, at most one with `parallel_tool_calls: false`;
- `auto`: free text, tool calls read out of it by the model's tool-call parser (`model.tool_call_parser`);
  a call counts only when it names a tool and its arguments are valid for that tool's schema;
- `none`, or no tools: free text, no tool calls (the tools are still rendered into the prompt).
A request with tools and no tool_choice means `auto`, as in OpenAI's API and vLLM. Every mode reads a
tool's `parameters` as xgrammar's strict mode does (strict_schema.py), and `parallel_tool_calls: false`
means at most one call in every mode.
"""
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import jsonschema
from pydantic import BaseModel, Field
from typing_extensions import Annotated

from appliance.engine.structured_output import StructuredOutput
from appliance.protocol.openai_fields import LENIENT, Text, member, picked_by
from appliance.protocol.strict_schema import strict_schema
from appliance.protocol.validation import field_error

NO_PARAMETERS = {"type": "object", "properties": {}}  # a function defined without parameters takes none: `{}`


class FunctionDefinition(BaseModel):
    model_config = LENIENT
    name: Text
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = Field(default=None, description="a JSON schema of the arguments object")
    strict: Optional[bool] = Field(default=None, description="accepted; the schema is always read in strict mode "
                                                             "(docs/serving.md)")


class Tool(BaseModel):
    model_config = LENIENT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = LENIENT
    name: Text


class NamedToolChoice(BaseModel):
    model_config = LENIENT
    type: Literal["function"]
    function: FunctionName


ToolChoice = Annotated[Union[Annotated[Literal["none", "auto", "required"], member("mode")],
                             Annotated[NamedToolChoice, member("function")]],
                       picked_by(lambda v: "mode" if isinstance(v, str) else "function" if isinstance(v, dict)
                                 else None)]


class FunctionCall(BaseModel):
    model_config = LENIENT
    name: Text
    arguments: str = Field(description="the arguments as JSON text")


class MessageToolCall(BaseModel):
    """A tool call an assistant message made earlier in the conversation."""
    model_config = LENIENT
    id: Text
    type: Literal["function"]
    function: FunctionCall


ToolCalls = Annotated[List[MessageToolCall], Field(min_length=1)]


@dataclass(frozen=True)
class ToolCalling:
    """What a request's answer holds: `mode` "named" (the function `name`), "required" or "auto";
    `parser`: the model's tool-call parser, which reads `auto` answers (set by the server); `schemas`:
    each tool's name and arguments schema as JSON text (`function_schema`), what a parsed call must
    match; `parallel`: False allows one call at most."""
    mode: str
    name: Optional[str] = None
    parser: Optional[str] = None
    schemas: Tuple[Tuple[str, str], ...] = ()
    parallel: bool = True


def function_schema(function: FunctionDefinition) -> Dict[str, Any]:
    """The arguments schema every mode holds a call to: `parameters` in strict mode, `{}` without them."""
    return strict_schema(function.parameters if function.parameters is not None else NO_PARAMETERS)


def tool_calling(tools: Optional[List[Tool]], choice: Any, fields_set: set,
                 parallel: Optional[bool] = None) -> Optional[ToolCalling]:
    """The request's ToolCalling (None: a plain text answer); `fields_set`: the fields the body sent;
    `parallel`: the body's parallel_tool_calls."""
    if "tool_choice" not in fields_set or choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    schemas = tuple((tool.function.name, json.dumps(function_schema(tool.function))) for tool in tools or ())
    name = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return ToolCalling("named" if name else choice, name, schemas=schemas, parallel=parallel is not False)


def check(tools: Optional[List[Tool]], choice: Any, calling: Optional[ToolCalling],
          constrained_elsewhere: bool) -> None:
    """Refuses (a field_error naming the field) what cannot be served: a choice without tools, a named
    function not among them, a second constraint beside a named or required choice, a tools' parameters
    schema that cannot compile."""
    given = tools or []
    names = [tool.function.name for tool in given]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise field_error(f"{name!r} repeats; each tool needs its own name", f"tools[{i}].function.name")
    if choice not in (None, "none") and tools is None:
        raise field_error("needs tools, the functions the model may call", "tool_choice")
    if calling is None:
        return
    if calling.mode == "auto":
        _check_readable(given)
        return
    if calling.mode == "named" and calling.name not in names:
        raise field_error(f"{calling.name!r} is not among tools ({', '.join(names) or 'none given'})",
                          "tool_choice.function.name")
    if calling.mode == "required" and not names:
        raise field_error("'required' needs at least one tool in tools", "tool_choice")
    if constrained_elsewhere:
        raise field_error("a named or required tool choice sets the answer's format; leave out response_format "
                          "and structured_outputs", "tool_choice")
    for i, tool in enumerate(given):
        if calling.mode == "required" or tool.function.name == calling.name:
            try:
                StructuredOutput("json", json.dumps(function_schema(tool.function))).check()
            except ValueError as e:
                raise field_error(str(e), f"tools[{i}].function.parameters") from e


def _check_readable(tools: List[Tool]) -> None:
    """An `auto` answer's calls are validated against their tool's schema: refuse one no validator reads."""
    for i, tool in enumerate(tools):
        schema = function_schema(tool.function)
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise field_error(f"not a valid JSON schema: {e.message}", f"tools[{i}].function.parameters") from None


def constraint(tools: List[Tool], calling: Optional[ToolCalling]) -> Optional[StructuredOutput]:
    """The grammar a named or required choice puts on the answer (None: free text)."""
    if calling is None or calling.mode == "auto":
        return None
    if calling.mode == "named":
        tool = next(t for t in tools if t.function.name == calling.name)
        return StructuredOutput("json", json.dumps(function_schema(tool.function)))
    return StructuredOutput("json", json.dumps(required_schema(tools, calling.parallel)))


def required_schema(tools: List[Tool], parallel: bool) -> Dict[str, Any]:
    """A JSON array of calls, each `{"name": <one tool>, "parameters": <its schema>}` (name first, so a
    stream names each call before its arguments)."""
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                             "parameters": function_schema(tool.function)}} for tool in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
