"""Beam search (`use_beam_search`) through `appliance serve` and the official `openai` client: vLLM's
test_batch_completions beam cases on completions, a chat request, streaming, and the refusals."""
import openai
import pytest

from tests.servers import data_url, image_question

PROMPT_LISTS = [["Hello, my name is"] * 2, [[0, 0, 0, 0, 0]] * 2]  # vLLM's test_batch_completions prompts
BEAMS = {"use_beam_search": True}


@pytest.fixture(scope="module")
def client(llava_server):
    return openai.OpenAI(base_url=f"{llava_server.base}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("prompts", PROMPT_LISTS, ids=["texts", "token-ids"])
def test_batch_completions_with_beam_search_as_vllm_tests_them(client, prompts):
    batch = client.completions.create(model="llava-tiny", prompt=prompts, n=2, max_tokens=5, temperature=0.0,
                                      extra_body=BEAMS)
    choices = batch.choices
    assert [c.index for c in choices] == [0, 1, 2, 3]
    assert choices[0].text != choices[1].text, "beam search should be different"
    assert choices[0].text == choices[2].text, "two copies of the same prompt should be the same"
    assert choices[1].text == choices[3].text, "two copies of the same prompt should be the same"
    assert all(c.finish_reason in ("stop", "length") for c in choices)
    one = client.completions.create(model="llava-tiny", prompt=prompts[0], max_tokens=5, extra_body=BEAMS)
    assert batch.usage.prompt_tokens == 2 * one.usage.prompt_tokens  # each prompt counted once


def test_a_beam_search_streams_each_answer_whole(client):
    fields = {"model": "llava-tiny", "prompt": "The shape is", "n": 3, "max_tokens": 6, "extra_body": BEAMS}
    whole = client.completions.create(**fields)
    chunks = list(client.completions.create(stream=True, **fields))
    streamed = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text, reasons = streamed.get(choice.index, ("", []))
            streamed[choice.index] = (text + choice.text, reasons + [choice.finish_reason] * bool(choice.finish_reason))
    assert streamed == {c.index: (c.text, [c.finish_reason]) for c in whole.choices}
    assert len({c.text for c in whole.choices}) == 3


def test_a_chat_beam_search_answers_n_different_finished_messages(client):
    answer = client.chat.completions.create(model="llava-tiny", messages=image_question(data_url()), n=2,
                                            max_tokens=12, extra_body={**BEAMS, "length_penalty": 0.0})
    first, second = answer.choices
    assert first.message.content and second.message.content and first.message.content != second.message.content
    assert {first.finish_reason, second.finish_reason} <= {"stop", "length"}
    assert answer.usage.completion_tokens >= 2


@pytest.mark.parametrize("fields, param", [
    ({"n": 2, "best_of": 1, **BEAMS}, "best_of"),
    ({"length_penalty": 2.0}, "length_penalty"),
    ({"stop": ".", **BEAMS}, "stop"),
])
def test_what_beam_search_cannot_honour_is_a_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="llava-tiny", prompt="The shape is", max_tokens=4, extra_body=fields)
    assert info.value.body["param"] == param
