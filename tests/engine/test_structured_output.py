"""Structured output and logit biases in the engine: grammar masks in the sampler, applied to the rows
that ask for them only, through preemption, seeds and mixed batches."""
import json
import re

import pytest
import torch

from appliance.engine.config import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.sampling_params import SamplingParams
from appliance.engine.structured_output import GrammarMatchers, StructuredOutput, allowed_tokens
from tests.engine.helpers import assert_no_block_leaks

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["shape", "filled", "size"],
          "properties": {"shape": {"type": "string", "enum": ["square", "circle", "star"]},
                         "filled": {"type": "boolean"}, "size": {"type": "integer", "minimum": 0, "maximum": 9}}}
JSON = StructuredOutput("json", json.dumps(SCHEMA))
REGEX = StructuredOutput("regex", r"(red|green|blue)-[0-9]{3}")
CHOICE = StructuredOutput("choice", json.dumps(["yes", "no", "maybe"]))
GBNF = StructuredOutput("grammar", 'root ::= "The shape is " ("round" | "pointy") "."')


@pytest.fixture(scope="module")
def engine(llama_dir):
    with LLMEngine(llama_dir, EngineConfig(num_kv_blocks=256)) as e:
        yield e


def prompts(engine, n):
    return [engine.tokenizer.encode(f"the quick brown fox {i}. ") for i in range(n)]


def check(structured: StructuredOutput, text: str) -> None:
    if structured is JSON:
        value = json.loads(text)
        assert set(value) == {"shape", "filled", "size"} and value["shape"] in ("square", "circle", "star")
        assert isinstance(value["filled"], bool) and 0 <= value["size"] <= 9
    elif structured is REGEX:
        assert re.fullmatch(r"(red|green|blue)-[0-9]{3}", text), text
    elif structured is CHOICE:
        assert text in ("yes", "no", "maybe")
    else:
        assert text in ("The shape is round.", "The shape is pointy."), text


@pytest.mark.parametrize("structured", [JSON, REGEX, CHOICE, GBNF], ids=["json", "regex", "choice", "gbnf"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_matches_the_grammar_and_stops_when_complete(engine, structured, temperature):
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=200, structured=structured)
              for i in range(4)]
    for out in engine.generate(prompts(engine, 4), params):
        assert out.finish_reason == "stop"
        check(structured, out.text)


def test_max_tokens_ends_mid_object_with_length(engine):
    filled = engine.grammars.fill_seconds
    (out,) = engine.generate(prompts(engine, 1), [SamplingParams(temperature=0, max_tokens=3, structured=JSON)])
    assert engine.grammars.fill_seconds > filled  # the mask thread's time is counted for the benchmark
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert '{"shape": "'.startswith(out.text) or out.text.startswith("{")
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_constrained_and_free_requests_share_a_batch_without_touching_each_other(engine):
    free = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=0.9, seed=5, max_tokens=12, ignore_eos=True)]
    alone = engine.generate(prompts(engine, 2), free)
    mixed = engine.generate(prompts(engine, 4),
                            free + [SamplingParams(temperature=0, max_tokens=60, structured=JSON),
                                    SamplingParams(temperature=0.9, seed=6, max_tokens=60, structured=REGEX)])
    assert [o.token_ids for o in mixed[:2]] == [o.token_ids for o in alone]
    check(JSON, mixed[2].text)
    check(REGEX, mixed[3].text)


def test_seeded_constrained_sampling_is_reproducible_and_survives_preemption(llama_dir, engine):
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=60, structured=JSON) for i in range(10)]
    calm = engine.generate(prompts(engine, 10), params)
    with LLMEngine(llama_dir, EngineConfig(num_kv_blocks=8, max_num_batched_tokens=32,
                                           enable_prefix_caching=False)) as pressured:
        outs = pressured.generate(prompts(engine, 10), params)
        assert pressured.stats()["num_preemptions"] > 0
        assert_no_block_leaks(pressured)
    assert [o.token_ids for o in outs] == [o.token_ids for o in calm]
    for out in outs:
        check(JSON, out.text)


def test_a_grammar_that_cannot_compile_is_refused_naming_the_problem(engine):
    for structured, fragment in [(StructuredOutput("json", '{"type": "objekt"}'), "objekt"),
                                 (StructuredOutput("json", "{not json"), "not JSON"),
                                 (StructuredOutput("regex", "a(b"), "regex"),
                                 (StructuredOutput("grammar", "root ::= ("), "grammar"),
                                 (StructuredOutput("yaml", "a: b"), "allowed: json, regex")]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            engine.add_request("hi", SamplingParams(structured=structured))
    assert not engine.has_unfinished()


def test_compiled_grammars_are_kept_per_spec_and_bounded(llama_dir, engine):
    matchers = GrammarMatchers(engine.tokenizer, engine.vocab_size, capacity=2)
    first = matchers.matcher(CHOICE)
    assert matchers.matcher(CHOICE) is not first, "each sequence gets its own matcher"
    for structured in (REGEX, GBNF, JSON):
        matchers.matcher(structured)
    assert matchers.cached() == [GBNF, JSON]
    matchers.close()


@pytest.mark.parametrize("words, vocab, allowed", [
    ([1], 3, [0]),
    ([0b101], 3, [0, 2]),
    ([-1], 32, list(range(32))),
    ([0, 1 << 3], 40, [35]),
    ([-2147483648], 32, [31]),
])
def test_bitmask_unpacking(words, vocab, allowed):
    mask = allowed_tokens(torch.tensor([words], dtype=torch.int32), vocab)
    assert mask.shape == (1, vocab) and mask[0].nonzero().flatten().tolist() == allowed


def test_logit_bias_moves_greedy_choices(engine):
    prompt = prompts(engine, 1)
    (plain,) = engine.generate(prompt, [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)])
    first = plain.token_ids[0]
    (banned,) = engine.generate(prompt, [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                        logit_bias={first: -100})])
    assert first not in banned.token_ids
    forced_id = (first + 7) % engine.vocab_size
    (forced,) = engine.generate(prompt, [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                        logit_bias={forced_id: 100})])
    assert forced.token_ids == [forced_id] * 4


@pytest.mark.parametrize("params, fragment", [
    (dict(logit_bias={10**6: 1.0}), "logit_bias: token ids [1000000] are outside the vocabulary"),
    (dict(logit_bias={-1: 1.0}), "logit_bias: token ids [-1]"),
    (dict(stop_token_ids=[5, 10**6]), "stop_token_ids: token ids [1000000]"),
])
def test_token_ids_outside_the_vocabulary_are_refused(engine, params, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        engine.add_request("hi", SamplingParams(**params))


def test_logit_bias_values_are_bounded():
    with pytest.raises(ValueError, match=r"logit_bias\[3\] must be in \[-100, 100\]"):
        SamplingParams(logit_bias={3: 101.0})

