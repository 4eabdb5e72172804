"""OpenAI request bodies through their pydantic models (appliance/protocol), in-process: what a good body
becomes, and for every field a bad value refused with an `InputError` naming the field's path."""
import json

import pytest

from appliance.engine.structured_output import StructuredOutput
from appliance.errors import InputError
from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.openai_requests import parse_chat, parse_completion

HI = [{"role": "user", "content": "Hi"}]


def chat(**fields):
    return {"messages": HI, **fields}


def completion(**fields):
    return {"prompt": "Hi", **fields}


def test_a_full_chat_body_fills_the_request():
    request = parse_chat(chat(model="m", max_completion_tokens=4.0, temperature=0, top_p=0.5, top_k=3, seed=-7,
                              min_tokens=1, stop="\n", stop_token_ids=[2], ignore_eos=True, n=3,
                              logit_bias={"17": -100, "5": 2.5}, logprobs=True, top_logprobs=2, user="u",
                              frequency_penalty=0, presence_penalty=0.0, stream=True,
                              stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert request.sampling == {"max_tokens": 4, "temperature": 0.0, "top_p": 0.5, "top_k": 3, "seed": -7,
                                "min_tokens": 1, "stop": "\n", "stop_token_ids": [2], "ignore_eos": True,
                                "logit_bias": {17: -100.0, 5: 2.5}, "logprobs": 2,
                                "decode_after_prompt": False}
    assert (request.kind, request.model, request.n, request.top_logprobs) == ("chat", "m", 3, 2)
    assert request.stream and request.include_usage and request.continuous_usage
    assert isinstance(request.sampling["max_tokens"], int)


def test_messages_are_kept_as_sent_with_their_other_keys():
    messages = [{"role": "developer", "content": "Be brief.", "name": "x"},
                {"role": "user", "content": [{"type": "text", "text": "What?", "cache": 1},
                                             {"type": "image_url", "image_url": {"url": "a.png", "detail": "low"}},
                                             {"type": "image_url", "image_url": "b.png"}], "tool_calls": None}]
    assert parse_chat({"messages": messages}).messages is messages


def test_nulls_are_unset_and_defaults_apply():
    request = parse_chat(chat(temperature=None, n=None, stream=None, logprobs=None))
    assert (request.sampling, request.n, request.stream, request.top_logprobs) == (
        {"decode_after_prompt": False}, 1, False, None)


@pytest.mark.parametrize("prompt, prompts", [
    ("Hi", ["Hi"]),
    ([1, 2, 3], [[1, 2, 3]]),
    (["Hi"], ["Hi"]),
    ([[1, 2]], [[1, 2]]),
    (["a", "b"], ["a", "b"]),
    ([[1], [2, 3]], [[1], [2, 3]]),
    ([1.0, 2], [[1, 2]]),
], ids=["text", "token ids", "one text in a list", "one token list in a list", "texts", "token id lists",
        "integral numbers"])
def test_completion_prompts_are_normalised_to_a_list(prompt, prompts):
    normalised = parse_completion(completion(prompt=prompt)).prompts
    assert normalised == prompts
    assert all(type(token) is int for one in normalised if isinstance(one, list) for token in one)


def test_token_ids_may_be_integral_numbers_as_json_schema_counts_them():
    request = parse_chat(chat(stop_token_ids=[2.0, 7]))
    assert request.sampling["stop_token_ids"] == [2, 7] and type(request.sampling["stop_token_ids"][0]) is int
    with pytest.raises(InputError, match="stop_token_ids"):
        parse_chat(chat(stop_token_ids=[2.5]))


def test_beam_search_fields():
    request = parse_completion(completion(use_beam_search=True, n=2, best_of=2, length_penalty=0.5, temperature=0.7))
    assert (request.use_beam_search, request.length_penalty, request.n) == (True, 0.5, 2)
    plain = parse_chat(chat(length_penalty=1.0))
    assert (plain.use_beam_search, plain.length_penalty) == (False, 1.0)
    assert parse_chat(chat(use_beam_search=True, n=3, stream=True)).use_beam_search  # one chunk per answer
    with pytest.raises(InputError, match=r"line 2: body.use_beam_search: True; batch requests cannot use beam"):
        parse_completion(completion(use_beam_search=True), at="line 2: body", allow_stream=False)


def test_completion_fields():
    request = parse_completion(completion(n=2, best_of=2, echo=True, logprobs=0, suffix=""))
    assert (request.kind, request.n, request.echo, request.top_logprobs) == ("completion", 2, True, 0)
    assert request.sampling == {"logprobs": 0, "prompt_logprobs": 0}, "echo with logprobs: the prompt is scored"
    assert parse_completion(completion(logprobs=2)).sampling == {"logprobs": 2}
    assert parse_completion(completion(n=4, best_of=1)).n == 4
    assert parse_completion(completion()).echo is False


@pytest.mark.parametrize("fields, structured", [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json", '{"type": "object"}')),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}},
     StructuredOutput("json", '{"type": "string"}')),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredOutput("choice", '["yes", "no"]')),
    ({"structured_outputs": {"json": '{"type": "integer"}'}}, StructuredOutput("json", '{"type": "integer"}')),
    ({"structured_outputs": {"regex": "[ab]+", "disable_fallback": True}}, StructuredOutput("regex", "[ab]+")),
])
def test_structured_output_fields(fields, structured):
    assert parse_chat(chat(**fields)).sampling.get("structured") == structured


BAD = [  # (body, param, fragment), chat unless it has a prompt
    ({}, "messages", "messages: required, a non-empty list of {role, content} messages"),
    (chat(messages=[]), "messages", "non-empty list"),
    (chat(messages=["Hi"]), "messages[0]", "expected an object {role, content}, got 'Hi'"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", "'robot'; allowed: system, developer"),
    (chat(messages=[{"content": "x"}]), "messages[0].role", "required"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "a string or a non-empty list of parts"),
    (chat(messages=[{"role": "user", "content": []}]), "messages[0].content", "got []"),
    (chat(messages=[HI[0], {"role": "user", "content": [{"type": "audio"}]}]), "messages[1].content[0].type",
     "'audio'; allowed: text, image_url"),
    (chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text",
     "required, a string"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]), "messages[0].content[0].text",
     "expected a string, got 5"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content[0].image_url.url", "required, a data:image"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": ""}]}]),
     "messages[0].content[0].image_url", "got ''"),
    (chat(functions=[]), "functions", "unknown or unsupported field; allowed: frequency_penalty, ignore_eos"),
    (chat(echo=True), "echo", "unknown or unsupported field"),
    (chat(model=5), "model", "expected a string"),
    (chat(user=["x"]), "user", "expected a string"),
    (chat(temperature="hot"), "temperature", "temperature: expected a number, got 'hot'"),
    (chat(temperature=True), "temperature", "expected a number, got True"),
    (chat(temperature=float("inf")), "temperature", "expected a number, got inf"),
    (chat(temperature=10 ** 400), "temperature", "expected a number"),
    (chat(temperature=-1), "temperature", "temperature must be >= 0"),
    (chat(top_p=0), "top_p", "top_p must be in (0, 1]"),
    (chat(top_p=float("nan")), "top_p", "expected a number, got nan"),
    (chat(top_k=1.5), "top_k", "expected an integer, got 1.5"),
    (chat(top_k=-1), "top_k", "top_k must be >= 0"),
    (chat(max_tokens=True), "max_tokens", "expected an integer, got True"),
    (chat(max_tokens="5"), "max_tokens", "expected an integer, got '5'"),
    (chat(max_tokens=0), "max_tokens", "max_tokens must be >= 1"),
    (chat(min_tokens=9, max_tokens=4), "min_tokens", "min_tokens must be in [0, max_tokens=4]"),
    (chat(seed=2 ** 63), "seed", "allowed: <= 9223372036854775807"),
    (chat(seed=-2 ** 63 - 1), "seed", "allowed: >= -9223372036854775808"),
    (chat(seed=1.5), "seed", "expected an integer"),
    (chat(stop=5), "stop", "expected a non-empty string or a list of them, got 5"),
    (chat(stop=["a", 1]), "stop", "got 1"),
    (chat(stop=[""]), "stop", "non-empty"),
    (chat(stop_token_ids=[-1]), "stop_token_ids", "token ids (integers >= 0), got -1"),
    (chat(stop_token_ids=[True]), "stop_token_ids", "got True"),
    (chat(ignore_eos=1), "ignore_eos", "expected true or false, got 1"),
    (chat(n=0), "n", "0; allowed: >= 1"),
    (chat(n=129), "n", "129; allowed: <= 128"),
    (chat(n=True), "n", "expected an integer, got True"),
    (chat(n=1.5), "n", "expected an integer"),
    (chat(stream="yes"), "stream", "expected true or false"),
    (chat(stream_options={"include_usage": True}), "stream_options", "only allowed with stream: true"),
    (chat(stream=False, stream_options={}), "stream_options", "only allowed with stream: true"),
    (chat(stream=True, stream_options={"x": 1}), "stream_options.x",
     "unknown or unsupported field; allowed: continuous_usage_stats, include_usage"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage", "true or false"),
    (chat(stream=True, stream_options=[]), "stream_options", "expected an object"),
    (chat(logprobs=3), "logprobs", "expected true or false, got 3"),
    (chat(top_logprobs=2), "top_logprobs", "needs logprobs: true"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs", "21; allowed: <= 20"),
    (chat(frequency_penalty=0.5), "frequency_penalty", "0.5; allowed: 0 only"),
    (chat(presence_penalty=False), "presence_penalty", "expected a number, got False"),
    (chat(logit_bias={"abc": 1}), "logit_bias.abc", "token id"),
    (chat(logit_bias={"-1": 1}), "logit_bias.-1", "token id"),
    (chat(logit_bias={"5": 150}), "logit_bias[5]", "[-100, 100]"),
    (chat(logit_bias={"5": True}), "logit_bias.5", "expected a number, got True"),
    (chat(logit_bias=[5]), "logit_bias", "an object of token id -> bias"),
    (chat(response_format={"type": "yaml"}), "response_format.type", "allowed: text, json_object, json_schema"),
    (chat(response_format={}), "response_format.type", "required"),
    (chat(response_format={"type": "json_schema"}), "response_format.json_schema", "required"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema", "required, a JSON schema object"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}),
     "response_format", "objekt"),
    (chat(structured_outputs={"regex": "a(b"}), "structured_outputs", "regex"),
    (chat(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs", "exactly one"),
    (chat(structured_outputs={}), "structured_outputs", "(got none)"),
    (chat(structured_outputs={"choice": []}), "structured_outputs.choice", "non-empty list of strings"),
    (chat(structured_outputs={"json": 5}), "structured_outputs.json", "a JSON schema"),
    (chat(structured_outputs={"grammar": ""}), "structured_outputs.grammar", "a non-empty string"),
    (chat(structured_outputs="x"), "structured_outputs", "one of json, regex, choice, grammar"),
    (chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a"}), "structured_outputs",
     "not both"),
    ({"max_tokens": 2}, "prompt", "prompt: required"),
    (completion(prompt=""), "prompt", "got ''"),
    (completion(prompt=[]), "prompt", "got []"),
    (completion(prompt=[1, -3]), "prompt", "got -3"),
    (completion(prompt=[1, True]), "prompt", "got True"),
    (completion(prompt=["a", ""]), "prompt", "got ''"),
    (completion(prompt=["a", 5]), "prompt", "got 5"),
    (completion(prompt=[[1], []]), "prompt", "got []"),
    (completion(prompt={"text": "x"}), "prompt", "a non-empty string, a non-empty list of token ids"),
    (completion(messages=HI), "messages", "unknown or unsupported field"),
    (completion(logprobs=True), "logprobs", "expected an integer, got True"),
    (completion(logprobs=21), "logprobs", "21; allowed: <= 20"),
    (completion(echo=1), "echo", "expected true or false"),
    (completion(n=2, best_of=3), "best_of", "3; allowed: 1 or n (2)"),
    (completion(best_of=0), "best_of", ">= 1"),
    (completion(suffix="x"), "suffix", "allowed: '' only"),
    (completion(use_beam_search=True, n=2, best_of=1), "best_of", "with use_beam_search the beam width is n (2)"),
    (completion(use_beam_search=1), "use_beam_search", "expected true or false"),
    (completion(length_penalty=0.5), "length_penalty", "only with use_beam_search: true"),
    (completion(use_beam_search=True, length_penalty="long"), "length_penalty", "expected a number"),
    (completion(use_beam_search=True, stop="."), "stop", "not with use_beam_search"),
    (completion(use_beam_search=True, logprobs=1), "logprobs", "not with use_beam_search"),
    (completion(use_beam_search=True, echo=True), "echo", "not with use_beam_search"),
    (chat(use_beam_search=True, logprobs=True), "logprobs", "not with use_beam_search"),
    (chat(use_beam_search=True, structured_outputs={"choice": ["a"]}), "structured_outputs",
     "not with use_beam_search"),
    (chat(use_beam_search=True, tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice="required"), "tools", "not with use_beam_search"),
    (completion(top_logprobs=2), "top_logprobs", "unknown or unsupported field"),
]


def _parse(body, **kw):
    return (parse_completion if "prompt" in body or body == {"max_tokens": 2} else parse_chat)(body, **kw)


@pytest.mark.parametrize("body, param, fragment", BAD, ids=[f"{b[1]} {i}" for i, b in enumerate(BAD)])
def test_a_bad_field_is_named_first(body, param, fragment):
    with pytest.raises(InputError) as info:
        _parse(body)
    assert info.value.param == param and str(info.value).startswith(param), str(info.value)
    assert fragment in str(info.value) and info.value.status == 400
    with pytest.raises(InputError) as batch:  # in a batch file: under the line and `body`
        _parse(body, at="line 3: body", allow_stream=False)
    assert batch.value.param == f"body.{param}" and fragment in str(batch.value)
    # SamplingParams' own range errors read `line 3: body: temperature must be >= 0`
    assert str(batch.value).startswith((f"line 3: body.{param}: ", f"line 3: body: {param} ")), str(batch.value)


def test_the_body_must_be_an_object_and_a_batch_cannot_stream():
    with pytest.raises(InputError, match="body: expected a JSON object, got list"):
        parse_chat([1])
    with pytest.raises(InputError, match=r"line 2: body.stream: True; batch requests cannot stream") as info:
        parse_chat(chat(stream=True), at="line 2: body", allow_stream=False)
    assert info.value.param == "body.stream"


def test_the_pipeline_defaults_are_checked_with_the_request():
    with pytest.raises(InputError, match=r"min_tokens must be in \[0, max_tokens=4\]"):
        parse_chat(chat(min_tokens=6), defaults={"max_tokens": 4})
    assert parse_chat(chat(min_tokens=3), defaults={"max_tokens": 4}).sampling == {
        "min_tokens": 3, "decode_after_prompt": False}


def test_the_models_schemas_show_what_they_check():
    chat_schema, completion_schema = ChatCompletionRequest.model_json_schema(), CompletionRequest.model_json_schema()
    assert chat_schema["required"] == ["messages"] and completion_schema["required"] == ["prompt"]
    assert chat_schema["additionalProperties"] is False
    properties = chat_schema["properties"]
    assert {"response_format", "structured_outputs", "n", "logit_bias", "stream_options", "top_logprobs"} <= set(
        properties)
    assert properties["n"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 128}
    assert properties["temperature"]["anyOf"][0]["minimum"] == 0  # SamplingParams' range, documented
    assert {"echo", "best_of", "suffix"} <= set(completion_schema["properties"]) and "echo" not in properties
    prompt = completion_schema["properties"]["prompt"]["oneOf"]
    assert [p["type"] for p in prompt] == ["string", "array", "array", "array"]
    assert chat_schema["$defs"]["ResponseFormat"]["properties"]["type"]["enum"] == ["text", "json_object",
                                                                                   "json_schema"]
    assert json.dumps(chat_schema).count("<") == 0  # union tags stay out of the document


FUNCTION = {"type": "function", "function": {"name": "Answer", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("body, params", [
    (chat(logit_bias={"abc": 1, "x": 2}), ["logit_bias.abc", "logit_bias.x"]),
    (chat(temperature=-1, top_p=2), ["temperature", "top_p"]),
    (chat(temperature="hot", n=0, stop=5), ["n", "temperature", "stop"]),
    (chat(logit_bias={"5": 150, "6": -101}), ["logit_bias[5]", "logit_bias[6]"]),
    # a function-calling request (LangChain's with_structured_output(method="function_calling"))
    (chat(tools=[{"type": "function", "function": {"name": "Answer", "parameters": 5}}],
          tool_choice={"type": "function", "function": {"name": "Answer"}}, parallel_tool_calls="no"),
     ["tools[0].function.parameters", "parallel_tool_calls"]),
    (chat(tools=[FUNCTION], tool_choice={"type": "function", "function": {"name": "Other"}},
          parallel_tool_calls=False), ["tool_choice.function.name"]),
])
def test_every_bad_field_is_named_in_one_error(body, params):
    with pytest.raises(InputError) as info:
        parse_chat(body)
    message = str(info.value)
    assert info.value.param == params[0] and message.startswith(params[0]), message
    assert [part.split(":")[0].split()[0] for part in message.split(" | ")] == params, message
    with pytest.raises(InputError) as batch:  # a batch file's line names them under its `body`
        parse_chat(body, at="line 3: body", allow_stream=False)
    assert batch.value.param == f"body.{params[0]}" and str(batch.value).startswith("line 3: body")
