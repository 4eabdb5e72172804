"""tool_choice "auto" on a model that chooses: the embedded tool-calling tiny LLaVA
(conf/model/llava_tiny_tools.yaml, `tool_call_parser: hermes`) served by `appliance serve`. Its chat
template lists the request's tools; it answers a draw request with one `<tool_call>` when draw_shape is
listed, and text when it is not or for a question about the image. Checked with the official `openai`
client (auto and tools without tool_choice, streamed and whole; tool lists in several orders, with and
without draw_shape) and LangChain's `bind_tools` defaults."""
import json

import jsonschema
import openai
import pytest
from transformers import AutoProcessor, AutoTokenizer

from tests.conftest import REPO
from tests.server_process import server_process
from tests.servers import data_url, image_question

MODEL_DIR = REPO / "appliance" / "assets" / "models" / "llava_tiny_tools"
MODEL = "llava-tiny-tools"
DRAW = {"type": "function", "function": {
    "name": "draw_shape", "description": "Draw one shape in one colour.",
    "parameters": {"type": "object", "required": ["shape", "color"], "properties": {
        "shape": {"type": "string", "enum": ["circle", "square", "triangle", "star"]},
        "color": {"type": "string", "enum": ["blue", "green", "orange", "purple", "red", "yellow"]}}}}}
RESIZE = {"type": "function", "function": {
    "name": "resize_shape", "description": "Make the shape in the image bigger or smaller.",
    "parameters": {"type": "object", "required": ["direction"],
                   "properties": {"direction": {"type": "string", "enum": ["bigger", "smaller"]}}}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today.",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, DRAW, RESIZE]
DRAW_REQUEST = [{"role": "user", "content": "Draw a blue circle."}]
FIELDS = [{"tool_choice": "auto"}, {}]  # tools without tool_choice mean "auto"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny_tools is missing")
    with server_process("pipeline=llava_chat", "model=llava_tiny_tools",
                        cwd=tmp_path_factory.mktemp("tools_serve")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client, messages, tools=TOOLS, stream=False, **fields):
    """(content, [(name, arguments)], finish_reason) of a greedy answer, a stream joined as a client does."""
    answer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=64,
                                            stream=stream, **({"tools": tools} if tools else {}), **fields)
    if not stream:
        message, reason = answer.choices[0].message, answer.choices[0].finish_reason
        return message.content, [(c.function.name, c.function.arguments) for c in message.tool_calls or ()], reason
    content, calls, reason = "", {}, None
    for chunk in answer:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                if call.id is not None:
                    calls[call.index] = [call.function.name, ""]
                calls[call.index][1] += call.function.arguments
            reason = choice.finish_reason or reason
    return content or None, [tuple(call) for call in calls.values()], reason


# ---- the template ----

@pytest.mark.parametrize("load", [AutoTokenizer, AutoProcessor], ids=["tokenizer", "processor"])
def test_the_chat_template_lists_the_tools(load):
    """transformers' apply_chat_template(tools=...) renders each tool as a JSON line in <tools>, keys sorted;
    without tools there is no tool block."""
    loaded = load.from_pretrained(MODEL_DIR)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Draw a blue circle."}]}]
    text = loaded.apply_chat_template(messages, tools=[DRAW, RESIZE], add_generation_prompt=True, tokenize=False)
    listed = "\n".join(json.dumps(tool, sort_keys=True) for tool in (DRAW, RESIZE))
    assert f"<tools>\n{listed}\n</tools>" in text and "<tool_call>" in text
    assert text.endswith("USER: Draw a blue circle. ASSISTANT:")
    plain = loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert plain == "USER: Draw a blue circle. ASSISTANT:"


# ---- the official client ----

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fields", FIELDS, ids=["auto", "default"])
def test_a_draw_request_gets_one_call_with_valid_arguments(client, stream, fields):
    content, calls, reason = ask(client, DRAW_REQUEST, stream=stream, **fields)
    assert reason == "tool_calls" and not content
    ((name, arguments),) = calls
    assert name == "draw_shape"
    jsonschema.validate(json.loads(arguments), DRAW["function"]["parameters"])
    assert json.loads(arguments) == {"shape": "circle", "color": "blue"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fields", FIELDS, ids=["auto", "default"])
def test_a_resize_request_calls_the_resize_tool(client, stream, fields):
    messages = image_question(data_url(), "Make the shape bigger.")
    content, calls, reason = ask(client, messages, stream=stream, **fields)
    assert (calls, reason) == ([("resize_shape", '{"direction": "bigger"}')], "tool_calls") and not content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fields", FIELDS, ids=["auto", "default"])
def test_a_question_about_the_image_gets_text(client, stream, fields):
    """The sample is an orange star; the tools are listed, and the answer is no call."""
    content, calls, reason = ask(client, image_question(data_url(), "What color is the shape?"), stream=stream,
                                 **fields)
    assert (calls, reason) == ([], "stop")
    assert "orange" in content and "<tool_call>" not in content


@pytest.mark.parametrize("tools", [[WEATHER, RESIZE], None], ids=["without-draw_shape", "no-tools"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_draw_request_gets_text_when_no_drawing_tool_is_listed(client, tools, stream):
    content, calls, reason = ask(client, DRAW_REQUEST, tools=tools, stream=stream)
    assert (calls, reason) == ([], "stop")
    assert content and "<tool_call>" not in content


@pytest.mark.parametrize("tools", [[DRAW], [RESIZE, DRAW], [DRAW, WEATHER], [WEATHER, RESIZE, DRAW], [WEATHER],
                                   [RESIZE, WEATHER]], ids=lambda tools: "+".join(t["function"]["name"] for t in tools))
@pytest.mark.parametrize("request_text,arguments", [
    ("Paint a green square.", {"shape": "square", "color": "green"}),
    ("Can you draw a purple triangle?", {"shape": "triangle", "color": "purple"})], ids=["paint", "draw"])
def test_the_model_reads_the_tool_list(client, tools, request_text, arguments):
    """Whatever the order and the other tools, a draw request is a call exactly when draw_shape is listed."""
    content, calls, reason = ask(client, [{"role": "user", "content": request_text}], tools=tools)
    if DRAW in tools:
        assert (reason, content) == ("tool_calls", None)
        assert [(name, json.loads(text)) for name, text in calls] == [("draw_shape", arguments)]
    else:
        assert (calls, reason, content) == ([], "stop", "I cannot draw: no drawing tool was given.")


# ---- LangChain ----

@pytest.fixture(scope="module")
def chat_model(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=f"{server.base}/v1", api_key="x", model=MODEL, temperature=0,
                                       max_tokens=64, max_retries=0, timeout=120)


def test_langchain_bind_tools_default_chooses(chat_model):
    """bind_tools(tools) sends no tool_choice: "auto". A draw request becomes a call, a question text."""
    bound = chat_model.bind_tools(TOOLS)
    called = bound.invoke("Paint a green square.")
    assert called.tool_calls and not called.invalid_tool_calls
    calls = [(call["name"], call["args"]) for call in called.tool_calls]
    assert calls == [("draw_shape", {"shape": "square", "color": "green"})]
    assert called.response_metadata["finish_reason"] == "tool_calls"
    answered = bound.invoke(image_question(data_url(), "What shape is this?"))
    assert not answered.tool_calls and not answered.invalid_tool_calls and "star" in answered.content
