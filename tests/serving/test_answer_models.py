"""A real `appliance serve`'s answers against the answer models (appliance/protocol), unknown fields
refused and every always-sent field required, so a drift between what the server sends and what its
OpenAPI document says fails here, either way; and the document's answer schemas are the models' own."""
import base64
import json

import httpx

from appliance.protocol.openai_answers import (ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk,
                                               ErrorResponse, ModelCard, ModelList)
from appliance.protocol.pooling import PoolingResponse
from appliance.protocol.tokenize import DetokenizeResponse, TokenizeResponse, TokenizerInfoResponse
from appliance.serving.http.openapi import REF
from tests.servers import API_KEY, SAMPLE_SCENE, data_url, image_question

# What the chat server's document must say each route answers (a stream: one event's data).
JSON, SSE = "application/json", "text/event-stream"
CHAT_ANSWERS = {
    ("post", "/v1/chat/completions"): {JSON: ChatCompletion, SSE: ChatCompletionChunk},
    ("post", "/v1/completions"): {JSON: Completion, SSE: CompletionChunk},
    ("post", "/tokenize"): {JSON: TokenizeResponse},
    ("post", "/detokenize"): {JSON: DetokenizeResponse},
    ("get", "/tokenizer_info"): {JSON: TokenizerInfoResponse},
    ("get", "/v1/models"): {JSON: ModelList},
    ("get", "/v1/models/{model_id}"): {JSON: ModelCard},
}
STREAM = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def post(server, path, body, **kwargs):
    return httpx.post(f"{server.base}{path}", json=body, timeout=120, **kwargs)


def answer(model, response, status=200):
    assert response.status_code == status, response.text
    return model.model_validate(response.json())


def chunks(model, response):
    """The stream's events as `model`s; it must end with [DONE]."""
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    data = [line[len("data: "):] for line in response.text.split("\n\n") if line]
    assert data[-1] == "[DONE]", data
    return [model.model_validate(json.loads(item)) for item in data[:-1]]


def test_a_chat_completion_and_its_chunks_are_the_models(llava_server):
    body = {"model": "llava-tiny", "messages": image_question(data_url()), "max_tokens": 4, "temperature": 0,
            "logprobs": True, "top_logprobs": 2, "n": 2}
    whole = answer(ChatCompletion, post(llava_server, "/v1/chat/completions", body))
    assert len(whole.choices[0].logprobs.content[0].top_logprobs) == 2
    streamed = chunks(ChatCompletionChunk, post(llava_server, "/v1/chat/completions", {**body, **STREAM}))
    assert streamed[0].choices[0].delta.role == "assistant" and streamed[-1].choices == []
    assert streamed[-1].usage == whole.usage
    assert any(c.choices and c.choices[0].logprobs for c in streamed)


def test_a_completion_with_logprobs_and_echo_and_its_chunks_are_the_models(llava_server):
    body = {"model": "llava-tiny", "prompt": "The sky is", "max_tokens": 3, "temperature": 0, "logprobs": 2,
            "echo": True}
    whole = answer(Completion, post(llava_server, "/v1/completions", body))
    logprobs = whole.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing predicts the first
    streamed = chunks(CompletionChunk, post(llava_server, "/v1/completions", {**body, **STREAM}))
    assert streamed[-1].choices == [] and streamed[-1].usage == whole.usage


def test_errors_are_the_model(llava_server):
    refused = answer(ErrorResponse, post(llava_server, "/v1/chat/completions", {"messages": [], "n": 1}), 400)
    assert refused.error.param == "messages"
    answer(ErrorResponse, post(llava_server, "/v1/completions", {"model": "gpt-4", "prompt": "x"}), 404)
    answer(ErrorResponse, httpx.get(f"{llava_server.base}/v1/nothing", timeout=10), 404)
    answer(ErrorResponse, httpx.get(f"{llava_server.base}/v1/chat/completions", timeout=10), 405)


def test_models_tokenize_and_detokenize_answers_are_the_models(llava_server):
    listed = answer(ModelList, httpx.get(f"{llava_server.base}/v1/models", timeout=10))
    assert answer(ModelCard, httpx.get(f"{llava_server.base}/v1/models/llava-tiny", timeout=10)) == listed.data[0]
    tokens = answer(TokenizeResponse, post(llava_server, "/tokenize", {"prompt": "Hi there",
                                                                      "return_token_strs": True}))
    assert len(tokens.token_strs) == tokens.count
    chat = answer(TokenizeResponse, post(llava_server, "/tokenize", {"messages": image_question(data_url())}))
    assert chat.token_strs is None and chat.count > 64  # the image's placeholders count
    text = answer(DetokenizeResponse, post(llava_server, "/detokenize", {"tokens": tokens.tokens}))
    assert "Hi there" in text.prompt


def test_a_pooling_answer_is_the_model(flood_server):
    body = {"data": {"data": base64.b64encode(SAMPLE_SCENE.read_bytes()).decode(), "data_format": "b64_json"}}
    pooled = answer(PoolingResponse, post(flood_server, "/pooling", body,
                                          headers={"Authorization": f"Bearer {API_KEY}"}))
    assert pooled.data.data_format == "b64_json" and pooled.data.request_id == pooled.request_id


def test_the_documents_answer_schemas_are_the_models(llava_server):
    document = httpx.get(f"{llava_server.base}/openapi.json", timeout=10).json()
    components = document["components"]["schemas"]
    for method, path in CHAT_ANSWERS:
        operation = document["paths"][path][method]
        for status, response in operation["responses"].items():
            if status != "200":
                assert response["content"] == {"application/json": {"schema": ref(ErrorResponse)}}, status
        content = operation["responses"]["200"]["content"]
        for kind, model in CHAT_ANSWERS[method, path].items():
            schema = content[kind]["schema"]
            if kind == "text/event-stream":  # one event: its data a chunk's JSON (or an error's, or [DONE])
                schema = schema["properties"]["data"]["else"]["contentSchema"]["anyOf"][0]
            assert schema == ref(model)
            own = model.model_json_schema(ref_template=REF)
            nested = own.pop("$defs", {})
            assert components[model.__name__] == own, model.__name__
            assert all(components[name] == definition for name, definition in nested.items())


def ref(model):
    return {"$ref": REF.format(model=model.__name__)}
