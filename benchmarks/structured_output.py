"""Step time of a batch half constrained by a JSON schema against the same batch unconstrained.

    .venv/bin/python benchmarks/structured_output.py                  # 32 requests, 64 tokens each
    .venv/bin/python benchmarks/structured_output.py --num-requests 8 --max-tokens 16   # quick

Bench model: the engine benchmark's random Llama (hidden 512, 8 layers, vocab 32000, fp32) with a
byte-level BPE tokenizer of 32000 tokens trained on synthetic JSON-like text (a grammar mask is only as
cheap as the vocabulary is small: a toy vocabulary would flatter it). Every request decodes
`--max-tokens` tokens (the schema needs more than that to complete, free requests ignore EOS), so both
runs step the same batch; prints the mean step time of each, the overhead, and the time the mask
thread spent filling masks (hidden behind the forward when the overhead is below it).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_throughput import bench_model

SCHEMA = {"type": "object", "required": ["labels"], "properties": {
    "labels": {"type": "array", "minItems": 64, "items": {"type": "string", "maxLength": 12}}}}


def build_model(path: str) -> None:
    """engine_throughput.py's Llama with a byte-level BPE vocabulary of 32000 tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))
             for _ in range(60000)]
    corpus = [json.dumps({rng.choice(words): [rng.choice(words) for _ in range(8)], "n": rng.randint(0, 10**6)})
              for _ in range(40000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=512, intermediate_size=1408,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


def step_times(engine, prompts, params):
    """Seconds of each step once every request is decoding (prefill steps left out)."""
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        if len(outputs) == len(prompts) and all(o.token_ids and len(o.token_ids) > 1 for o in outputs):
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-dir", help="reuse (or build into) this directory")
    args = parser.parse_args()

    from appliance.engine.config import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from appliance.engine.structured_output import StructuredOutput

    rng = random.Random(0)
    with bench_model(args.model_dir, build=build_model) as path:
        engine = LLMEngine(path, EngineConfig(num_kv_blocks=1024, max_num_seqs=args.num_requests))
        prompts = [[rng.randrange(3, engine.vocab_size) for _ in range(rng.randint(32, 128))]
                   for _ in range(args.num_requests)]
        structured = StructuredOutput("json", json.dumps(SCHEMA))

        def params(constrained: bool, i: int):
            return SamplingParams(temperature=args.temperature, seed=i, max_tokens=args.max_tokens,
                                  ignore_eos=True, structured=structured if constrained else None)

        step_times(engine, prompts[:2], [params(True, 0), params(False, 1)])  # warm-up, grammar compiled
        fill_before = engine.grammars.fill_seconds
        free, half = [], []
        for _ in range(args.rounds):  # alternated, so a drifting host biases neither side
            free.append(statistics.mean(step_times(engine, prompts, [params(False, i) for i in range(len(prompts))])))
            half.append(statistics.mean(step_times(engine, prompts, [params(i % 2 == 0, i)
                                                                      for i in range(len(prompts))])))
        fill_seconds = engine.grammars.fill_seconds - fill_before
        engine.close()

    free_ms, half_ms = statistics.median(free) * 1e3, statistics.median(half) * 1e3
    constrained_steps = args.rounds * args.max_tokens
    flags = sorted({f for f in open("/proc/cpuinfo").read().split() if f in ("avx2", "avx512f", "amx_bf16")})
    print(f"host: {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, flags {' '.join(flags)}")
    print(f"{args.num_requests} requests, {args.max_tokens} tokens each, temperature {args.temperature}, "
          f"vocab {engine.vocab_size}")
    print(f"| batch (median of {args.rounds} alternated rounds) | mean decode step ms |")
    print("|---|---|")
    print(f"| unconstrained | {free_ms:.1f} |")
    print(f"| half constrained (JSON schema) | {half_ms:.1f} |")
    print(f"overhead: {100 * (half_ms / free_ms - 1):+.1f} %; mask filling: "
          f"{1e3 * fill_seconds / constrained_steps:.1f} ms a step on the mask thread")


if __name__ == "__main__":
    main()
