"""The text of an answer: a chat answer reads as transformers' `decode` of its ids; a completion continues
its prompt's text (a first word keeps the space that joins it to the prompt, as vLLM and OpenAI give it).
The embedded tiny LLaVA's SentencePiece tokenizer drops a word's leading space at the start of a decode."""
import pytest
from transformers import AutoTokenizer

from appliance.config.schema import EngineConfig
from appliance.engine.detokenizer import IncrementalDetokenizer
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampling_params import SamplingParams
from tests.servers import LLAVA_TINY

pytestmark = pytest.mark.skipif(not (LLAVA_TINY / "config.json").is_file(),
                                reason="appliance/assets/models/llava_tiny is missing")
PROMPT = "USER: What color is the shape? ASSISTANT:"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(LLAVA_TINY))


def streamed(detok: IncrementalDetokenizer, ids):
    return "".join(detok.add(i) for i in ids) + detok.flush()


@pytest.mark.parametrize("label, with_prompt, expected", [
    ("decoded alone: a chat answer", False, "It is orange."),
    ("after the prompt: a completion", True, " It is orange."),
])
def test_the_first_word_keeps_its_space_only_after_the_prompt(tokenizer, label, with_prompt, expected):
    answer = tokenizer.encode(" It is orange.", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.convert_ids_to_tokens(answer[0]).startswith("\u2581"), "the answer's first token starts a word"
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT) if with_prompt else [])
    assert streamed(detok, answer) == detok.text == expected
    if not with_prompt:
        assert expected == tokenizer.decode(answer, skip_special_tokens=True)


def test_the_engine_decodes_a_chat_answer_as_transformers_does(tokenizer):
    prompt = tokenizer.encode(PROMPT)
    greedy = {"temperature": 0, "max_tokens": 12}
    with LLMEngine(str(LLAVA_TINY), EngineConfig(max_num_seqs=2, max_model_len=256)) as engine:
        chat, completion = engine.generate([prompt, prompt], [SamplingParams(**greedy, decode_after_prompt=False),
                                                              SamplingParams(**greedy)])
    assert chat.token_ids == completion.token_ids
    decoded = tokenizer.decode(chat.token_ids, skip_special_tokens=True)
    assert decoded and not decoded.startswith(" ")
    assert chat.text == decoded
    assert completion.text == " " + decoded, "a completion continues the prompt's text after its space"
