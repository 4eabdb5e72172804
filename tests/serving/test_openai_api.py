"""`appliance serve pipeline=llava_chat` through the official `openai` client, as users reach it."""
import asyncio
import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from appliance.protocol.openai_models import ChatCompletionRequest, CompletionRequest
from appliance.protocol.openai_responses import token_decoder
from tests.chat.conftest import batch_request, clear_samples, names_only, synthetic_shapes, write_jsonl
from tests.conftest import run_cli
from tests.servers import LLAVA_TINY, data_url, error, image_question, png_data_url

JSON_TYPE = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client(llava_server):
    return openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_list_names_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["llava-tiny"]


def test_models_retrieve_gives_the_served_model_and_404_for_another(client):
    assert client.models.retrieve("llava-tiny").id == "llava-tiny"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("org/gpt-4")
    assert info.value.body["param"] == "model" and "The model 'org/gpt-4' does not exist" in info.value.body["message"]


def test_chat_streaming_and_not_give_the_same_greedy_answer(client):
    messages = image_question(data_url())
    whole = client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=16, temperature=0)
    choice = whole.choices[0]
    assert "orange" in choice.message.content.lower() and choice.finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=16,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    # 64 image placeholder tokens and the chat-templated text are all prompt tokens.
    assert whole.usage.prompt_tokens > 64
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_a_chat_answer_reads_as_transformers_decode_of_its_tokens(client):
    tokenizer = AutoTokenizer.from_pretrained(str(LLAVA_TINY))
    text_of = token_decoder(tokenizer)  # a logprob entry's token: its id's text inside an answer
    ids_of: dict = {}
    for token_id in range(len(tokenizer)):
        ids_of.setdefault(text_of(token_id), []).append(token_id)
    ask = {"model": "llava-tiny", "messages": image_question(data_url()), "max_tokens": 16, "temperature": 0}
    whole = client.chat.completions.create(**ask, logprobs=True)
    tokens = [entry.token for entry in whole.choices[0].logprobs.content]
    assert all(len(ids_of[token]) == 1 for token in tokens), "each answer token names one id"
    expected = tokenizer.decode([ids_of[token][0] for token in tokens], skip_special_tokens=True)
    assert tokens[0].startswith(" ") and not expected.startswith(" ")
    assert whole.choices[0].message.content == expected
    chunks = client.chat.completions.create(**ask, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


def test_usage_and_finish_reason_are_exact(client):
    short = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=2,
                                           temperature=0, logprobs=True)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2
    assert len(short.choices[0].logprobs.content) == 2
    full = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=40,
                                          temperature=0, logprobs=True)
    # EOS ends the answer and counts as a completion token (one logprob per token generated).
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens == len(full.choices[0].logprobs.content)
    assert full.usage.prompt_tokens == short.usage.prompt_tokens


def test_logprobs_rank_the_greedy_token_first(client):
    out = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=3)
    entries = out.choices[0].logprobs.content
    assert "".join(e.token for e in entries).strip() in out.choices[0].message.content + "</s>"
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert entry.bytes == list(entry.token.encode())
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)


def test_completions_text_and_token_ids_streaming_and_not(client):
    whole = client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=5, temperature=0,
                                      logprobs=2)
    text = whole.choices[0].text
    assert whole.usage.completion_tokens == len(whole.choices[0].logprobs.tokens)
    assert "".join(whole.choices[0].logprobs.tokens) in (text, text + "</s>")
    streamed = client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=5, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text
    ids = httpx.post(f"{client.base_url}completions", json={"prompt": [1, 20, 30, 40], "max_tokens": 3}, timeout=60)
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 4
    outside = httpx.post(f"{client.base_url}completions", json={"prompt": [1, 100000]}, timeout=60)
    assert outside.status_code == 400 and "token id 100000" in error(outside)["message"]


def test_sampling_fields_seed_stop_and_extensions(client):
    messages = image_question(data_url())
    seeded = [client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=8, temperature=1.0,
                                             seed=7).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    greedy = client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=16, temperature=0)
    word = greedy.choices[0].message.content.split()[1]
    stopped = client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=16, temperature=0,
                                             stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and word not in stopped.choices[0].message.content
    long = client.chat.completions.create(model="llava-tiny", messages=messages, max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True, "min_tokens": 12})
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 12


def test_the_server_answers_as_the_offline_batch_verb(client, tmp_path):
    """One implementation of request parsing and response shaping: same greedy text, same usage."""
    questions = {"a": "What color is the shape?", "b": "What shape is this?"}
    lines = [batch_request(cid, [{"type": "image_url", "image_url": {"url": data_url()}},
                                 {"type": "text", "text": q}], max_tokens=12, temperature=0)
             for cid, q in questions.items()]
    batch = write_jsonl(tmp_path / "requests.jsonl", lines)
    result = run_cli("run", "pipeline=llava_chat", f"input={batch}", f"output={tmp_path / 'answers.jsonl'}")
    assert result.returncode == 0, result.stderr
    offline = [json.loads(line)["response"]["body"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    for line, body in zip(lines, offline):
        online = client.chat.completions.create(**{**line["body"], "model": "llava-tiny"})
        assert online.choices[0].message.content == body["choices"][0]["message"]["content"]
        assert online.usage.model_dump(exclude_none=True) == body["usage"]


def test_sixteen_concurrent_image_questions_are_answered_right(llava_server, client):
    shapes = synthetic_shapes()
    candidates = list(clear_samples(shapes, 24, first_seed=3000))
    alone = {}
    for image, labels in candidates:  # one at a time first: which the tiny model gets right
        url = png_data_url(image)
        answer = client.chat.completions.create(model="llava-tiny", messages=image_question(url), max_tokens=12,
                                                temperature=0).choices[0].message.content
        if names_only(answer, labels.color, shapes.COLORS):
            alone[url] = (answer, labels.color)
        if len(alone) == 16:
            break
    assert len(alone) == 16, "the tiny LLaVA answers fewer than 16 of 24 plain shapes right alone"

    async def ask_all():
        async with openai.AsyncOpenAI(base_url=f"{llava_server.base}/v1", api_key="x", max_retries=0,
                                      timeout=300) as aclient:
            return await asyncio.gather(*[aclient.chat.completions.create(
                model="llava-tiny", messages=image_question(url), max_tokens=12, temperature=0) for url in alone])

    together = asyncio.run(ask_all())
    for (_url, (answer, colour)), result in zip(alone.items(), together):
        assert result.choices[0].message.content == answer
        assert names_only(result.choices[0].message.content, colour, shapes.COLORS)


BAD_CHAT = [
    ("wrong type", {"temperature": "hot"}, "temperature", "expected a number"),
    ("negative", {"temperature": -1}, "temperature", "temperature must be >= 0"),
    ("n above 128", {"n": 129}, "n", "allowed: <= 128"),
    ("unknown field", {"functions": []}, "functions", "unknown or unsupported field"),
    ("top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs", "logprobs: true"),
    ("stream_options without stream", {"stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
    ("max_tokens past the context", {"max_tokens": 5000}, "max_tokens", "max_tokens is 5000"),
    ("bad role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "allowed: system"),
    ("empty messages", {"messages": []}, "messages", "non-empty"),
    ("two images", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "?"}]}]},
     "messages", "2 images in one request"),
    ("broken data URL", {"messages": image_question("data:image/png;base64,AAAA")},
     "messages[0].content[0].image_url", "image"),
    ("server path without a media dir", {"messages": image_question("/etc/passwd")},
     "messages[0].content[0].image_url", "allowed"),
]


@pytest.mark.parametrize("label,fields,param,fragment", BAD_CHAT, ids=[b[0] for b in BAD_CHAT])
def test_bad_chat_requests_get_400_naming_the_field(llava_server, label, fields, param, fragment):
    body = {"model": "llava-tiny", "messages": image_question(data_url()), "max_tokens": 4, **fields}
    response = httpx.post(f"{llava_server.base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    err = error(response)
    assert err["param"] == param and fragment in err["message"], err
    assert err["type"] == "BadRequestError"


def test_unknown_model_is_404_and_bad_json_400(llava_server, client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "model" and "llava-tiny" in info.value.body["message"]
    bad = httpx.post(f"{llava_server.base}/v1/chat/completions", content=b'{"messages": [', headers=JSON_TYPE,
                     timeout=10)
    assert bad.status_code == 400 and "not valid JSON" in error(bad)["message"]
    nan = httpx.post(f"{llava_server.base}/v1/chat/completions", timeout=10, headers=JSON_TYPE,
                     content=b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')
    assert nan.status_code == 400 and "NaN" in error(nan)["message"]
    route = httpx.get(f"{llava_server.base}/v1/nothing", timeout=10)
    assert route.status_code == 404 and error(route)["message"].startswith("/v1/nothing: no such route; this "
                                                                          "server answers /")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= _named_routes(error(route)["message"])
    # LitServe's, answered as unknown (its `GET /` is the page's here: tests/ui, 404 with server.ui=false)
    for litserve_route in ("/litserve/health", "/litserve/info"):
        answer = httpx.get(f"{llava_server.base}{litserve_route}", timeout=10)
        assert answer.status_code == 404 and "no such route" in error(answer)["message"], litserve_route
        assert litserve_route not in _named_routes(error(answer)["message"])
    assert httpx.get(f"{llava_server.base}/health", timeout=10).json() == {"status": "ok"}


def test_openapi_describes_the_routes_and_wrong_methods_get_405(llava_server):
    schema = httpx.get(f"{llava_server.base}/openapi.json", timeout=10).json()
    for path, model in (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest)):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        own = model.model_json_schema(ref_template="#/components/schemas/{model}")  # the model that validates
        nested = own.pop("$defs")
        assert body == own and all(schema["components"]["schemas"][name] == d for name, d in nested.items())
        assert {"response_format", "structured_outputs", "n", "logit_bias", "stream_options"} <= set(
            body["properties"])
    chat, completion = (schema["paths"][p]["post"]["requestBody"]["content"]["application/json"]["schema"]
                        for p in ("/v1/chat/completions", "/v1/completions"))
    assert chat["required"] == ["messages"] and completion["required"] == ["prompt"]
    assert {"echo", "best_of"} <= set(completion["properties"]) and "echo" not in chat["properties"]
    assert schema["components"]["schemas"]["Message"]["properties"]["role"]["enum"][0] == "system"
    assert {"/health", "/ready", "/version", "/metrics", "/v1/models"} <= set(schema["paths"])
    wrong = httpx.get(f"{llava_server.base}/v1/chat/completions", timeout=10)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


def _named_routes(message: str) -> set:
    return {path.strip() for path in message.partition("this server answers ")[2].split(",")}


def test_continuous_usage_is_on_every_chunk_from_the_first_and_only_with_include_usage(client):
    def chunks(**options):
        return list(client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()),
                                                   max_tokens=4, temperature=0, stream=True,
                                                   stream_options=options))

    every = chunks(include_usage=True, continuous_usage_stats=True)
    assert every[0].choices[0].delta.role == "assistant" and every[0].usage.completion_tokens == 0
    assert all(c.usage is not None for c in every)
    assert [c.usage.completion_tokens for c in every[1:]] == sorted(c.usage.completion_tokens for c in every[1:])
    assert every[-1].choices == [] and every[-1].usage.completion_tokens == every[-2].usage.completion_tokens
    assert len({c.usage.prompt_tokens for c in every}) == 1
    assert all(c.usage is None for c in chunks(include_usage=False, continuous_usage_stats=True))


def test_a_completion_stream_opens_with_its_first_token_as_vllms(client):
    """vLLM's completion streams have no opening chunk: with continuous usage the first reports the first
    token (completion_tokens 1, its text); a chat's first is the role chunk with 0 completion tokens."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=4, temperature=0,
                                            stream=True, stream_options=options, extra_body={"ignore_eos": True}))
    first, tokens = chunks[0], [c for c in chunks if c.choices]
    assert first.choices[0].text and first.usage.completion_tokens == 1
    counts = [c.usage.completion_tokens for c in tokens]  # a token whose text is incomplete waits for the next
    assert counts == sorted(set(counts)) and counts[-1] == 4
    whole = client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in tokens) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
