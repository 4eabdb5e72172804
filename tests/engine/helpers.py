"""Builders and comparisons shared by the engine tests."""
import math
import mmap
import struct
from typing import Dict, List, Optional, Sequence

import torch

TRAIN_TEXT = [
    "the quick brown fox jumps over the lazy dog. ",
    "héllo wörld, ça va? naïve café résumé. ",
    "日本語のテキストと中文文本。 ",
    "emoji 😀🚀🎉 and symbols €£¥ ∑∫√. ",
    "def add(a, b):\n    return a + b\n",
]


def build_tokenizer(path: str, vocab_size: int = 400):
    """Byte-level BPE: every byte is a token, so multi-byte characters can split across tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN_TEXT * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)
    return fast


def build_checkpoint(path, tie_word_embeddings=False, max_shard_size=None, seed=0, num_layers=2, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = str(path)
    tok = build_tokenizer(path)
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              tie_word_embeddings=tie_word_embeddings, bos_token_id=tok.bos_token_id,
              eos_token_id=tok.eos_token_id)
    cfg = LlamaConfig(**{**kw, **extra})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a larger init than HF's default gives peaked, tie-free distributions
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kw)
    return path


def hf_greedy(model_dir: str, prompts: Sequence[List[int]], max_tokens: int, top_n: int = 5):
    """Reference for a Llama checkpoint: `greedy_reference` over transformers' LlamaForCausalLM."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return greedy_reference(model, prompts, max_tokens, top_n)


def greedy_reference(model, prompts: Sequence[List[int]], max_tokens: int, top_n: int = 5,
                     extra_inputs: Optional[Sequence[dict]] = None):
    """A manual greedy loop over an HF model's forward (full recompute, no cache classes).

    `extra_inputs[i]` holds prompt i's keyword inputs besides input_ids (pixel_values, image_sizes).
    Returns, per prompt, the greedy tokens and each step's top-N logprobs.
    """
    results = []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            extra = extra_inputs[i] if extra_inputs else {}
            ids, tokens, lps = list(prompt), [], []
            for _ in range(max_tokens):
                logits = model(input_ids=torch.tensor([ids]), **extra).logits[0, -1].float()
                logprobs = torch.log_softmax(logits, -1)
                vals, top = logprobs.topk(top_n)
                tok = int(logits.argmax())
                tokens.append(tok)
                lps.append(dict(zip(top.tolist(), vals.tolist())))
                ids.append(tok)
            results.append((tokens, lps))
    return results


def check_logprobs_close(ref_tokens: List[int], ref_lps: List[Dict[int, float]], tokens: List[int],
                         lps: List[Dict[int, float]], atol: float = 1e-3, tie: float = 1e-4, name: str = ""):
    """Tokens must match; top-N logprobs within atol. A divergence is accepted only at a near-tie
    (both candidates within `tie` of each other in both runs), and the comparison stops there."""
    assert len(tokens) == len(ref_tokens), f"{name}: {len(tokens)} tokens vs reference {len(ref_tokens)}"
    for i, (a, b) in enumerate(zip(ref_tokens, tokens)):
        ref, ours = ref_lps[i], lps[i]
        if a != b:
            gap_ref = abs(ref.get(a, -math.inf) - ref.get(b, -math.inf))
            gap_ours = abs(ours.get(a, -math.inf) - ours.get(b, -math.inf))
            assert gap_ref < tie and gap_ours < tie, (
                f"{name}: token {i} differs ({a} vs {b}) and is not a near-tie "
                f"(gaps {gap_ref:.2e} / {gap_ours:.2e})")
            return i
        for tid, lp in ref.items():
            assert tid in ours, f"{name}: token {i}: reference top token {tid} missing from ours {ours}"
            assert abs(ours[tid] - lp) < atol, f"{name}: token {i}: logprob of {tid} {ours[tid]} vs {lp}"
    return len(tokens)


def random_prompts(vocab: int, lengths: Sequence[int], seed: int = 0) -> List[List[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def assert_no_block_leaks(engine) -> None:
    assert not engine.has_unfinished(), "engine still has unfinished requests"
    engine.block_manager.check_no_leaks()


def resident_bytes(start: int, nbytes: int) -> int:
    """Bytes of this process's memory [start, start + nbytes) that pages back, read from
    /proc/self/pagemap (bit 63: present), which reports without touching anything."""
    page = mmap.PAGESIZE
    first, end = start // page, -(-(start + nbytes) // page)
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read((end - first) * 8)
    return page * sum(entry >> 63 for (entry,) in struct.iter_unpack("<Q", entries))


def write_awq_checkpoint(out, group_size: int, **options):
    """The tiny LLaVA written in AWQ's GEMM layout into `out` (scripts/awq_checkpoint.py, with its
    `options`); returns `out`."""
    from tests.servers import LLAVA_TINY

    return _script("awq_checkpoint").write_awq_checkpoint(out, LLAVA_TINY, group_size, **options)


def write_gptq_checkpoint(out, group_size: int, **options):
    """The tiny LLaVA written in GPTQ's layout into `out` (scripts/gptq_checkpoint.py, with its `options`);
    returns `out`."""
    from tests.servers import LLAVA_TINY

    return _script("gptq_checkpoint").write_gptq_checkpoint(out, LLAVA_TINY, group_size, **options)


def _script(name: str):
    """scripts/`name`.py as a module (scripts/ is not a package; its modules import each other by name, as
    they do when run, so scripts/ joins the import path)."""
    import importlib.util
    import sys

    from tests.servers import REPO

    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
