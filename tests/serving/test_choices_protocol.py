"""`n`, prompt lists, `echo` and legacy logprobs as pure functions: the parser, the answers' seeds, the
shaping (no model)."""
import pytest

from appliance.errors import InputError
from appliance.protocol.openai_requests import parse_chat, parse_completion
from appliance.protocol.openai_responses import Choice, TokenLogprob, answer_logprobs, chat_completion, \
    completion_logprobs, echo_text, prompt_token_logprobs, text_completion, with_echo
from appliance.stages.engine_stage import answer_sampling

PROMPTS = [
    ("one text", "hi", ["hi"]),
    ("one token-id list", [1, 2, 3], [[1, 2, 3]]),
    ("a list of texts", ["a", "b"], ["a", "b"]),
    ("a list of token-id lists", [[1, 2], [3]], [[1, 2], [3]]),
    ("a batch of one", ["a"], ["a"]),
]


@pytest.mark.parametrize("label,prompt,prompts", PROMPTS, ids=[p[0] for p in PROMPTS])
def test_completion_prompts_are_always_a_list(label, prompt, prompts):
    assert parse_completion({"prompt": prompt}).prompts == prompts


BAD = [
    ("empty list", {"prompt": []}, "prompt", "non-empty list"),
    ("texts and ids mixed (OpenAI's prompt is one or the other)", {"prompt": ["a", [4, 5]]}, "prompt",
     "non-empty list"),
    ("a number among prompts", {"prompt": ["a", 5]}, "prompt", "expected a non-empty string"),
    ("an empty text among prompts", {"prompt": ["a", ""]}, "prompt", "empty"),
    ("a negative id", {"prompt": [[1, -2]]}, "prompt", "integers >= 0"),
    ("n zero", {"prompt": "a", "n": 0}, "n", "allowed: >= 1"),
    ("n past 128", {"prompt": "a", "n": 129}, "n", "allowed: <= 128"),
    ("n a bool", {"prompt": "a", "n": True}, "n", "an integer"),
    ("echo a string", {"prompt": "a", "echo": "yes"}, "echo", "true or false"),
]


@pytest.mark.parametrize("label,body,param,fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_completion_fields_name_the_field(label, body, param, fragment):
    with pytest.raises(InputError) as info:
        parse_completion(body)
    assert info.value.param == param and fragment in str(info.value)


def test_n_and_echo_reach_the_request():
    request = parse_completion({"prompt": "a", "n": 3, "echo": True, "logprobs": 0})
    assert (request.n, request.echo, request.top_logprobs) == (3, True, 0)
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "n": 5}).n == 5
    with pytest.raises(InputError) as info:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "echo": True})
    assert info.value.param == "echo"


@pytest.mark.parametrize("sampling,answer,seed", [
    ({"seed": 7}, 0, 7), ({"seed": 7}, 2, 9), ({"seed": -1}, 1, 0), ({}, 3, None), ({"seed": None}, 1, None),
])
def test_answer_i_samples_with_seed_plus_i(sampling, answer, seed):
    given = dict(sampling)
    assert answer_sampling(sampling, answer).get("seed") == seed
    assert sampling == given, "the request's own sampling is untouched"


def test_only_the_first_answer_scores_the_prompt():
    sampling = {"prompt_logprobs": 1, "logprobs": 1, "seed": 3}
    assert answer_sampling(sampling, 0) == sampling
    assert answer_sampling(sampling, 2) == {"logprobs": 1, "seed": 5}, "its siblings share the computed prompt"


def test_echo_puts_the_prompt_in_front_of_the_text_and_the_logprobs():
    detokenize = {(1, 5): "The"}.__getitem__
    assert echo_text("The shape", detokenize) == "The shape"
    assert echo_text([1, 5], lambda ids: detokenize(tuple(ids))) == "The", "token ids echo as their text"
    prompt = [TokenLogprob("<s>", None, ()), TokenLogprob(" The", -2.0, ())]
    answer = [TokenLogprob(" red", -0.5, ())]
    assert with_echo("The", prompt, " red", answer) == ("The red", prompt + answer)
    assert with_echo("The", None, " red", None) == ("The red", None), "no logprobs asked: none"


def test_legacy_logprobs_hold_the_sampled_token_and_a_prompt_starts_with_null():
    decode = {1: "<s>", 5: " The", 6: " shape"}.__getitem__
    prompt = prompt_token_logprobs([1, 5], [None, {5: -2.0, 6: -1.0}], 0, decode)
    sampled = [TokenLogprob(" shape", -0.5, ())]  # logprobs: 0, the top N empty
    body = completion_logprobs(prompt + sampled)
    assert body == {"tokens": ["<s>", " The", " shape"], "token_logprobs": [None, -2.0, -0.5],
                    "top_logprobs": [None, {" The": -2.0}, {" shape": -0.5}], "text_offset": [0, 3, 7]}


def test_choices_keep_their_index():
    body = text_completion("cmpl-1", "m", 0, [Choice(0, "a", "stop"), Choice(1, "b", "length")],
                           {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [(0, "a", "stop"),
                                                                                      (1, "b", "length")]


@pytest.mark.parametrize("shape", [chat_completion, text_completion])
def test_whole_answers_list_their_choices_in_index_order_however_they_came(shape):
    """The server gets its answers' events as they finish; the batch verb in order: both shape here."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    body = shape("id-1", "m", 0, [Choice(2, "c", "stop"), Choice(0, "a", "stop"), Choice(1, "b", "length")], usage)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]


def test_an_answers_logprobs_only_when_asked_and_reported():
    decode = {5: " The", 6: " shape"}.__getitem__
    reported = [{5: -0.5, 6: -1.5}]
    assert answer_logprobs([5], reported, None, decode) is None  # not asked
    assert answer_logprobs([5], None, 1, decode) is None  # asked, none reported
    assert answer_logprobs([5], reported, 1, decode) == [TokenLogprob(" The", -0.5, ((" The", -0.5),))]
