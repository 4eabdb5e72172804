"""`server.stream_interval`: a stream's first chunk at once, then one chunk per N tokens, the rest with
the last; the text, usage and logprobs are those of the whole answer."""
import openai
import pytest

from tests.conftest import run_cli
from tests.server_process import server_process
from tests.servers import LLAVA_TINY, data_url, image_question

INTERVAL = 4


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    if not (LLAVA_TINY / "config.json").is_file():
        pytest.skip("appliance/assets/models/llava_tiny is missing")
    with server_process("pipeline=llava_chat", f"server.stream_interval={INTERVAL}",
                        cwd=tmp_path_factory.mktemp("stream_interval")) as server:
        yield openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_stream_sends_the_first_token_then_one_chunk_per_interval(client):
    body = dict(model="llava-tiny", messages=image_question(data_url()), max_tokens=10, temperature=0,
                logprobs=True, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert [len(c.choices[0].logprobs.content) for c in content] == [1, 4, 4, 1]
    assert "".join(c.choices[0].delta.content for c in content) == whole.choices[0].message.content
    streamed = [e.token for c in content for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in whole.choices[0].logprobs.content]
    assert content[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 10


def test_an_answer_shorter_than_the_interval_still_arrives_whole(client):
    body = dict(model="llava-tiny", messages=image_question(data_url()), max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**body).choices[0]
    chunks = list(client.chat.completions.create(**body, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "stop"


def test_an_interval_below_one_is_refused_before_start_up():
    result = run_cli("serve", "pipeline=llava_chat", "server.stream_interval=0")
    assert result.returncode == 2, result.stderr
    assert "server.stream_interval: 0; allowed: 1 or more" in result.stderr
