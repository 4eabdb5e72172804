#!/usr/bin/env python
"""Real scale: a LLaVA-1.5-7B-shaped and a Prithvi-EO-2.0-300M-TL-shaped flood model (random weights),
built once into a directory, then measured against transformers on the same files.

    .venv/bin/python benchmarks/real_scale.py DIR                  # build DIR once, then measure it all
    .venv/bin/python benchmarks/real_scale.py DIR --quick          # 8 decode tokens, 8 streams, 1024² scene
    .venv/bin/python benchmarks/real_scale.py DIR --startup-only   # time to ready and peak RSS only
    .venv/bin/python benchmarks/real_scale.py DIR --shape tiny     # the same at toy shapes (a smoke run)
    .venv/bin/python benchmarks/real_scale.py DIR --runs ours,served --decode-only --quantization none,int8
                      # text prompts only (hosts too slow for image prefills at 7B): one stream's decode
                      # and 8 streams' tok/s, in one process and served, bf16 weights against int8, with
                      # the int8 run's logprob drift
    .venv/bin/python benchmarks/real_scale.py DIR --runs served --decode-only --quick --quantization int8 \
        --text-streams 64 --access-log on,off
                      # the request log's cost at 7B: 64 text streams served with server.access_log on, then
                      # off, each with the HTTP process's CPU time per request

Built (skipped when DIR/<shape>/BUILT exists):
- `llava/`: llava-hf's LLaVA-1.5-7B config and checkpoint key layout (transformers 4.x names:
  `language_model.model.*`, `language_model.lm_head.*`, `vision_tower.vision_model.*`,
  `multi_modal_projector.*`), CLIP ViT-L/14-336 + Llama-2-7B shapes with vocab 32064, random bf16
  weights written shard by shard (2 GB shards: the model is never held whole), the embedded tiny
  LLaVA's tokenizer and chat template with its image processor set to 336 pixels. The tokenizer's
  `<image>` id and vocabulary fit the config (checked after the build).
- `prithvi_300m_tl_flood.pt`: terratorch's Lightning checkpoint layout (`state_dict`, `model.` keys)
  for conf/model/prithvi_300m_tl_flood.yaml, random bf16 weights; `scene_<side>.tif`: a synthetic
  HLS-like scene (scripts/synthetic_scenes.py).

Measured, each in its own process, one after another (never two 7B models in memory at once):
- ours in one process: time to ready (`LLMEngine` built), a warm-up (an 8-token text prompt, one token
  out: every weight read once; transformers gets the same), TTFT of one image question, decode ms/token
  of one stream, output tok/s with 8 and 32 image questions at once (distinct images: over the whole run,
  and `decoding_tok_s` while all of them decode, no prefill in it; `--concurrency` says how many at once),
  peak RSS;
- ours served: `appliance serve` to /ready, then the same through the official `openai` client
  (streaming; tokens from the server's usage counts; no `decoding_tok_s`: questions arriving during a
  prefill start decoding while later ones still prefill), peak RSS of the engine process; with
  `--decode-only`, `--text-streams N` text streams at once (8 by default), and the HTTP process's CPU
  time per request over them (`http_cpu_ms`); with `--access-log on,off`, once per setting of
  `server.access_log`;
- transformers: `from_pretrained` (bf16) to ready, TTFT and decode of one image question via
  `generate`, peak RSS;
- the flood pipeline (`appliance run`'s stages in process): load, tiles/s on the scene, peak RSS.
Engines run with their defaults (engine.dtype=auto, the KV cache sized from the machine) unless
`--dtype` says otherwise. The table heads with the CPU's relevant flags and the dtype each chose.
"""
import argparse
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))

from serve import access_log_settings  # benchmarks/ is on the path only from here

TINY_LLAVA = REPO / "appliance" / "assets" / "models" / "llava_tiny"
SHAPES = {
    "7b": {"text": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=32),
           "vision": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                          projection_dim=768),
           "prithvi": "prithvi_300m_tl_flood", "scene": 2048, "quick_scene": 1024},
    "tiny": {"text": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4),
             "vision": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=2,
                            projection_dim=64),
             "prithvi": "prithvi_tiny_tl_flood", "scene": 256, "quick_scene": 128},
}
VOCAB = 32064  # llava-hf's LLaVA-1.5 vocabulary (Llama-2's 32000, <image>, <pad>, padded to 64)
IMAGE_SIZE, PATCH = 336, 14
QUESTION = "What is in this image? Describe it."
SHARD_BYTES = 2 * 2 ** 30
WARMUP_IDS = [1, 5, 6, 7, 8, 9, 10, 11]  # a short text prompt, one token out: every weight read once
NATIVE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


# ---- building ----------------------------------------------------------------------------------------

def llava_config(shape: dict, tokenizer) -> dict:
    image_id, pad_id = tokenizer.convert_tokens_to_ids("<image>"), tokenizer.pad_token_id
    text = {"model_type": "llama", **shape["text"], "vocab_size": VOCAB, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": pad_id, "tie_word_embeddings": False,
            "dtype": "bfloat16"}
    vision = {"model_type": "clip_vision_model", **shape["vision"], "image_size": IMAGE_SIZE, "patch_size": PATCH,
              "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "dtype": "bfloat16"}
    return {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "dtype": "bfloat16",
            "image_token_index": image_id, "image_seq_length": (IMAGE_SIZE // PATCH) ** 2, "pad_token_id": pad_id,
            "projector_hidden_act": "gelu", "multimodal_projector_bias": True, "tie_word_embeddings": False,
            "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
            "text_config": text, "vision_config": vision}


def llava_tensors(config: dict):
    """(name, shape) of every tensor of llava-hf's LLaVA-1.5 checkpoint (transformers 4.x names)."""
    t, v = config["text_config"], config["vision_config"]
    h, i, heads, kv = t["hidden_size"], t["intermediate_size"], t["num_attention_heads"], t["num_key_value_heads"]
    hd = h // heads
    yield "language_model.model.embed_tokens.weight", (VOCAB, h)
    for n in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{n}."
        yield from [(p + "self_attn.q_proj.weight", (heads * hd, h)), (p + "self_attn.k_proj.weight", (kv * hd, h)),
                    (p + "self_attn.v_proj.weight", (kv * hd, h)), (p + "self_attn.o_proj.weight", (h, heads * hd)),
                    (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                    (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
                    (p + "post_attention_layernorm.weight", (h,))]
    yield "language_model.model.norm.weight", (h,)
    yield "language_model.lm_head.weight", (VOCAB, h)
    d, vi, grid = v["hidden_size"], v["intermediate_size"], IMAGE_SIZE // PATCH
    p = "vision_tower.vision_model."
    yield from [(p + "embeddings.class_embedding", (d,)),
                (p + "embeddings.patch_embedding.weight", (d, 3, PATCH, PATCH)),
                (p + "embeddings.position_embedding.weight", (grid * grid + 1, d)),
                (p + "pre_layrnorm.weight", (d,)), (p + "pre_layrnorm.bias", (d,))]
    for n in range(v["num_hidden_layers"]):
        q = f"{p}encoder.layers.{n}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield from [(f"{q}self_attn.{proj}.weight", (d, d)), (f"{q}self_attn.{proj}.bias", (d,))]
        yield from [(q + "layer_norm1.weight", (d,)), (q + "layer_norm1.bias", (d,)), (q + "mlp.fc1.weight", (vi, d)),
                    (q + "mlp.fc1.bias", (vi,)), (q + "mlp.fc2.weight", (d, vi)), (q + "mlp.fc2.bias", (d,)),
                    (q + "layer_norm2.weight", (d,)), (q + "layer_norm2.bias", (d,))]
    yield from [(p + "post_layernorm.weight", (d,)), (p + "post_layernorm.bias", (d,)),
                ("multi_modal_projector.linear_1.weight", (h, d)), ("multi_modal_projector.linear_1.bias", (h,)),
                ("multi_modal_projector.linear_2.weight", (h, h)), ("multi_modal_projector.linear_2.bias", (h,))]


class RandomFill:
    """Random-looking bf16 weights at memcpy speed: slices of one 64M-value N(0, 0.02) pool at random
    offsets (normal_ on 7B values takes ~90 s on two cores; the values matter only for being finite)."""

    def __init__(self, seed: int = 0):
        import torch

        self.gen = torch.Generator().manual_seed(seed)
        self.pool = torch.empty(64 * 2 ** 20, dtype=torch.bfloat16).normal_(0, 0.02, generator=self.gen)

    def __call__(self, name: str, shape):
        import torch

        n = 1
        for d in shape:
            n *= d
        if name.endswith("bias"):
            return torch.zeros(shape, dtype=torch.bfloat16)
        if "norm" in name and name.endswith("weight"):  # layer norms, RMS norms: ones
            return torch.ones(shape, dtype=torch.bfloat16)
        out, filled = torch.empty(n, dtype=torch.bfloat16), 0
        while filled < n:
            take = min(n - filled, self.pool.numel() // 2)
            start = int(torch.randint(0, self.pool.numel() - take + 1, (1,), generator=self.gen))
            out[filled:filled + take] = self.pool[start:start + take]
            filled += take
        return out.view(shape)


def build_llava(path: Path, shape: dict) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY_LLAVA / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = llava_config(shape, tokenizer)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("preprocessor_config.json", "processor_config.json"):
        text = (TINY_LLAVA / name).read_text()
        for key in ("height", "width", "shortest_edge"):
            text = text.replace(f'"{key}": 112', f'"{key}": {IMAGE_SIZE}')
        (path / name).write_text(text)
    tensors = list(llava_tensors(config))
    shards, size = [[]], 0
    for name, dims in tensors:
        nbytes = 2 * int(torch.tensor(dims).prod())
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += nbytes
    fill, weight_map = RandomFill(), {}
    for k, shard in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: fill(name, dims) for name, dims in shard}, str(path / file), metadata={"format": "pt"})
        weight_map.update({name: file for name, _ in shard})
        print(f"  {file}: {len(shard)} tensors", flush=True)
    total = sum(2 * int(torch.tensor(d).prod()) for _, d in tensors)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=1))
    check_tokenizer(path, config)


def check_tokenizer(path: Path, config: dict) -> None:
    """The tokenizer's <image> id is the config's, its ids fit the vocabulary, ids past it decode."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = prompt_ids(tok)
    assert ids.count(config["image_token_index"]) == 1, "the chat template should hold one <image> token"
    assert max(ids) < VOCAB and len(tok) <= VOCAB, (max(ids), len(tok))
    tok.decode([5, 300, len(tok) + 7, VOCAB - 1])  # a random model samples ids the tokenizer lacks


def prompt_ids(tokenizer) -> list:
    """The image question through the model's chat template, as token ids (one <image>, not expanded)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        add_generation_prompt=True, tokenize=False)
    return tokenizer(text)["input_ids"]


def build_prithvi(path: Path, model_name: str) -> None:
    import torch

    from appliance.config.compose import compose
    from appliance.engine.materialize import build_on_meta
    from appliance.engine.models.prithvi import build_prithvi_segmentation

    cfg = compose(["pipeline=prithvi_flood", f"model={model_name}"])
    meta = build_on_meta(lambda: build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands)))
    fill, state = RandomFill(1), {}
    for name, t in meta.state_dict().items():
        if not t.is_floating_point():
            state["model." + name] = torch.zeros(t.shape, dtype=t.dtype)
        elif name.endswith("running_var"):
            state["model." + name] = torch.ones(t.shape, dtype=torch.bfloat16)
        else:
            state["model." + name] = fill(name, tuple(t.shape)).clone()
    torch.save({"state_dict": state}, path)


def build(root: Path, shape_name: str) -> None:
    from synthetic_scenes import write_scene

    shape = SHAPES[shape_name]
    if (root / "BUILT").exists():
        return
    started = time.perf_counter()
    print(f"building {shape_name} models into {root} ...", flush=True)
    build_llava(root / "llava", shape)
    build_prithvi(root / f"{shape['prithvi']}.pt", shape["prithvi"])
    for side in (shape["scene"], shape["quick_scene"]):
        write_scene(root / f"scene_{side}.tif", side, side, seed=1)
    (root / "BUILT").write_text(f"{time.perf_counter() - started:.0f} s\n")
    print(f"built in {time.perf_counter() - started:.0f} s", flush=True)


# ---- children: one measurement each, in its own process -------------------------------------------------

def peak_rss_gib(pid="self") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 2 ** 20
    return float("nan")


def images(n: int, seed: int = 0):
    from image_preprocess import photo_like

    return [photo_like(seed + i, 640, 480) for i in range(n)]


def child_ours(root: Path, args) -> dict:
    import torch

    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.multimodal import ImageItem
    from appliance.engine.sampling_params import SamplingParams
    from appliance.vision.clip_preprocess import clip_preprocess, load_preprocess_config
    from appliance.vision.image_load import content_hash

    path = str(root / "llava")
    start = time.perf_counter()
    engine = LLMEngine(path, EngineConfig(dtype=args.dtype, quantization=args.quantization))
    out = {"ready_s": time.perf_counter() - start, "dtype": engine.cfg.dtype.value + (
               "+int8" if args.quantization == "int8" else ""),
           "kv_tokens": engine.executor.num_kv_blocks * engine.cfg.block_size, "rss_ready_gib": peak_rss_gib()}
    start = time.perf_counter()
    engine.generate([WARMUP_IDS], SamplingParams(temperature=0, max_tokens=1))
    out["warmup_s"] = time.perf_counter() - start
    if args.startup_only:
        out["rss_gib"] = peak_rss_gib()
        return out
    if args.decode_only:
        return {**out, **decode_only(engine, 8 if args.quick else 32)}
    tok, pre = engine.tokenizer, load_preprocess_config(path)
    image_id, count = engine.image_token_id, (IMAGE_SIZE // PATCH) ** 2
    ids = prompt_ids(tok)
    at = ids.index(image_id)
    prompt = ids[:at] + [image_id] * count + ids[at + 1:]

    def request(image):
        return prompt, [ImageItem(content_hash(image), at, count, pixel_values=clip_preprocess(image, pre))]

    def run(batch, max_tokens):
        """(first-token times, per-request token arrival times, wall) of requests added at once."""
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        rids = [engine.add_request(p, params, mm_data=mm) for p, mm in batch]
        arrivals = {r: [] for r in rids}
        while engine.has_unfinished():
            for o in engine.step():
                arrivals[o.request_id] += [time.perf_counter() - t0] * len(o.new_token_ids)
        return arrivals, time.perf_counter() - t0

    tokens = 8 if args.quick else 32
    arrivals, _ = run([request(images(1, 100)[0])], tokens)
    times = next(iter(arrivals.values()))
    out.update(ttft_s=times[0], decode_ms=1000 * (times[-1] - times[0]) / (len(times) - 1))
    for c in concurrencies(args):
        arrivals, wall = run([request(im) for im in images(c, 1000 * c)], tokens)
        out[f"tok_s_{c}"] = sum(map(len, arrivals.values())) / wall
        out[f"decoding_tok_s_{c}"] = all_decoding_rate(list(arrivals.values()))
    out["rss_gib"] = peak_rss_gib()
    out["threads"] = torch.get_num_threads()
    return out


def all_decoding_rate(arrivals: list) -> float:
    """Output tok/s while every stream decodes (the batch's decode rate, no prefill in it): the tokens that
    arrive after the last stream's first token, up to the first stream's last, over that time. None when
    the streams never all decode at once (the KV cache holds fewer)."""
    start, end = max(a[0] for a in arrivals), min(a[-1] for a in arrivals)
    tokens = sum(1 for a in arrivals for t in a if start < t <= end)
    return tokens / (end - start) if end > start and tokens else None


def concurrencies(args) -> list:
    """How many image questions at once the runs measure: --concurrency, or 8 with --quick."""
    return [8] if args.quick else [int(c) for c in args.concurrency.split(",")]


def text_prompt(number: int) -> list:
    """The decode-only runs' prompts: 32 tokens, distinct per stream (no prefix shared beyond BOS), from
    id 1000 on, clear of the `<image>` token (427 in the tokenizer the built model ships) for any number
    of streams."""
    return WARMUP_IDS + [1000 + 24 * number + i for i in range(24)]


def decode_only(engine, tokens: int) -> dict:
    """Text prompts only: one stream's decode ms/token and the greedy tokens' logprobs (for the drift of
    one run against another), then 8 streams at once (tok/s), peak RSS."""
    from appliance.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=0)
    start, times = time.perf_counter(), []
    rid = engine.add_request(text_prompt(0), params)
    final = None
    while engine.has_unfinished():
        for o in engine.step():
            times += [time.perf_counter() - start] * len(o.new_token_ids)
            final = o if o.request_id == rid else final
    start, produced = time.perf_counter(), 0
    for number in range(1, 9):
        engine.add_request(text_prompt(number), SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return {"ttft_s": times[0], "decode_ms": 1000 * (times[-1] - times[0]) / (len(times) - 1),
            "tok_s_8": produced / (time.perf_counter() - start),
            "token_ids": final.token_ids, "logprobs": [lp[t] for t, lp in zip(final.token_ids, final.logprobs)],
            "rss_gib": peak_rss_gib()}


def drift(a: dict, b: dict) -> str:
    """How far b's greedy logprobs stray from a's over the tokens both chose alike, and where they part."""
    same = next((i for i, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), len(a["token_ids"]))
    deltas = [abs(x - y) for x, y in zip(a["logprobs"][:same], b["logprobs"][:same])]
    return (f"greedy tokens identical for {same} of {len(a['token_ids'])}; logprob drift over them: "
            f"mean {sum(deltas) / max(len(deltas), 1):.4f}, max {max(deltas, default=0):.4f}")


def child_transformers(root: Path, args) -> dict:
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = str(root / "llava")
    start = time.perf_counter()
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16)
    model.eval()
    out = {"ready_s": time.perf_counter() - start, "dtype": "bfloat16", "rss_ready_gib": peak_rss_gib()}
    start = time.perf_counter()
    with torch.inference_mode():  # the same warm-up as ours: its weights are read from the files now
        model.generate(input_ids=torch.tensor([WARMUP_IDS]), max_new_tokens=1, do_sample=False)
    out["warmup_s"] = time.perf_counter() - start
    if args.startup_only:
        out["rss_gib"] = peak_rss_gib()
        return out
    tokens = 8 if args.quick else 32
    if args.decode_only:  # ours' one-stream prompt (text_prompt(0)), greedy, no image
        inputs = {"input_ids": torch.tensor([text_prompt(0)]), "attention_mask": torch.ones(1, len(text_prompt(0)),
                                                                                               dtype=torch.long)}
    else:
        processor = AutoProcessor.from_pretrained(path)
        text = processor.apply_chat_template([{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": QUESTION}]}], add_generation_prompt=True)
        inputs = processor(images=images(1, 100)[0], text=text, return_tensors="pt")
    arrivals = TokenClock()
    with torch.inference_mode():  # one call, timed token by token: two calls' difference can go negative
        arrivals.start()
        model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, streamer=arrivals)
    times = arrivals.token_times
    out.update(ttft_s=times[0], decode_ms=1000 * (times[-1] - times[0]) / (len(times) - 1), rss_gib=peak_rss_gib())
    return out


class TokenClock:
    """A transformers streamer that notes when each generated token arrives (the first put is the prompt)."""

    def start(self):
        self.started = time.perf_counter()
        self.puts = 0
        self.token_times = []

    def put(self, value):
        self.puts += 1
        if self.puts > 1:
            self.token_times.append(time.perf_counter() - self.started)

    def end(self):
        pass


def child_flood(root: Path, args) -> dict:
    from appliance.config.compose import compose
    from appliance.stages.build import build_pipeline

    shape = SHAPES[args.shape]
    side = shape["quick_scene" if args.quick else "scene"]
    checkpoint = root / f"{shape['prithvi']}.pt"
    overrides = ["pipeline=prithvi_flood", f"model={shape['prithvi']}", f"model.checkpoint={checkpoint}"]
    if args.dtype != "auto":
        overrides.append(f"engine.dtype={args.dtype}")
    pipeline = build_pipeline(compose(overrides))
    pipeline.check()
    start = time.perf_counter()
    pipeline.setup()
    engine = next(s for s in pipeline.stages if s.name == "engine").engine
    ready = time.perf_counter() - start
    start = time.perf_counter()
    out_path = root / "flood_out.tif"
    scene = root / f"scene_{side}.tif"
    records = list(pipeline.run([{"input": str(scene), "output": str(out_path), "overwrite": True}]))
    wall = time.perf_counter() - start
    tiles = int(re.search(r", (\d+) tiles?,", records[0]["display"]).group(1))
    return {"ready_s": ready, "dtype": str(engine.dtype).replace("torch.", ""), "scene": f"{side}x{side}",
            "tiles": tiles, "tiles_s": tiles / wall, "rss_gib": peak_rss_gib()}


CHILDREN = {"ours": child_ours, "transformers": child_transformers, "flood": child_flood}


def run_child(kind: str, root: Path, args) -> dict:
    argv = [sys.executable, __file__, str(args.dir), "--child", kind, "--shape", args.shape, "--dtype", args.dtype,
            "--quantization", args.quantization, "--concurrency", args.concurrency,
            *(["--quick"] if args.quick else []),
            *(["--startup-only"] if args.startup_only else []), *(["--decode-only"] if args.decode_only else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["exit %d" % result.returncode])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---- served ------------------------------------------------------------------------------------------

def served(root: Path, args, access_log: str = "on") -> dict:
    import asyncio

    from serve import Server

    # Queued image questions wait for the prefills ahead of them: minutes each on a CPU.
    overrides = ["pipeline=llava_chat", "model=llava_1_5_7b", f"model.path={root / 'llava'}",
                 f"engine.quantization={args.quantization}", "server.limits.request_timeout_s=7200",
                 f"server.access_log={'true' if access_log == 'on' else 'false'}"]
    if args.dtype != "auto":
        overrides.append(f"engine.dtype={args.dtype}")
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    start, out = time.perf_counter(), {}
    try:
        with Server(*overrides, cwd=REPO, env=env, startup_s=1800) as server:
            out["ready_s"] = time.perf_counter() - start
            if args.decode_only:
                out.update(asyncio.run(drive_served_text(server, args)))
            elif not args.startup_only:
                out.update(asyncio.run(drive_served(server.port, args)))
            out["rss_gib"] = max(peak_rss_gib(pid) for pid in server.pids())
    except RuntimeError as e:  # it exited or never became ready
        return {"error": str(e)}
    return out


async def drive_served(port: int, args) -> dict:
    import asyncio

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)
    tokens = 8 if args.quick else 32

    def data_url(image) -> str:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    async def one(image):
        t0, arrivals, used = time.perf_counter(), [], 0
        stream = await client.chat.completions.create(
            model="llava-1.5-7b", stream=True, max_tokens=tokens, temperature=0, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                                   {"type": "text", "text": QUESTION}]}])
        async for chunk in stream:
            if chunk.choices:  # any: a random model's tokens often decode to no text (ids past the tokenizer's)
                arrivals.append(time.perf_counter() - t0)
            if chunk.usage:
                used = chunk.usage.completion_tokens
        return arrivals, used

    out = {}
    arrivals, used = await one(images(1, 100)[0])
    out.update(ttft_s=arrivals[0], decode_ms=1000 * (arrivals[-1] - arrivals[0]) / max(1, used - 1))
    for c in concurrencies(args):
        t0 = time.perf_counter()
        results = await asyncio.gather(*[one(im) for im in images(c, 1000 * c)])
        out[f"tok_s_{c}"] = sum(u for _, u in results) / (time.perf_counter() - t0)
    await client.close()
    return out


async def drive_served_text(server, args) -> dict:
    """`decode_only` through the server: the same token-id prompts over `/v1/completions` (streaming),
    then `args.text_streams` at once, with the HTTP process's CPU time per request over those."""
    import asyncio

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=3600)
    tokens = 8 if args.quick else 32

    async def one(number: int):
        t0, arrivals, used = time.perf_counter(), [], 0
        stream = await client.completions.create(
            model="llava-1.5-7b", prompt=text_prompt(number), stream=True, max_tokens=tokens, temperature=0,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices:
                arrivals.append(time.perf_counter() - t0)
            if chunk.usage:
                used = chunk.usage.completion_tokens
        return arrivals, used

    arrivals, used = await one(0)
    out = {"ttft_s": arrivals[0], "decode_ms": 1000 * (arrivals[-1] - arrivals[0]) / max(1, used - 1)}
    streams = args.text_streams
    t0, http_before = time.perf_counter(), server.cpu_seconds()["http"]
    results = await asyncio.gather(*[one(number) for number in range(1, streams + 1)])
    out[f"tok_s_{streams}"] = sum(u for _, u in results) / (time.perf_counter() - t0)
    out["http_cpu_ms"] = 1000 * (server.cpu_seconds()["http"] - http_before) / streams
    await client.close()
    return out


# ---- the table -----------------------------------------------------------------------------------------

def table(rows) -> str:
    cols = ["ready_s", "warmup_s", "rss_ready_gib", "ttft_s", "decode_ms", "tok_s_8", "decoding_tok_s_8", "tok_s_32",
            "decoding_tok_s_32", "rss_gib", "tiles_s"]
    cols += sorted({k for _, r in rows for k in r if k.startswith("tok_s_") and k not in cols}) + ["http_cpu_ms"]
    cols = [c for c in cols if any(c in r for _, r in rows)]  # a column no run measured says nothing
    header = ["run", "dtype", *cols]
    lines = [[name, r.get("dtype", ""), *[_fmt(r.get(c)) for c in cols]] for name, r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    def fmt(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, lines)])


def _fmt(v) -> str:
    return "" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="where the models are built (once) and read from")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--quick", action="store_true", help="8 tokens, 8 streams, the smaller scene")
    ap.add_argument("--startup-only", action="store_true", help="time to ready and peak RSS only")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--dtype", default="auto", help="engine.dtype for our runs (default: auto)")
    ap.add_argument("--quantization", default="none",
                    help="engine.quantization for our runs (ours, served): none, int8, or both as none,int8")
    ap.add_argument("--decode-only", action="store_true",
                    help="text prompts only: one stream's decode (ours: and its logprobs), 8 streams (ours, served)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every run")
    ap.add_argument("--runs", default="ours,served,transformers,flood")
    ap.add_argument("--concurrency", default="8,32", help="image questions at once (ours, served)")
    ap.add_argument("--text-streams", type=int, default=8, help="with --decode-only: text streams at once (served)")
    ap.add_argument("--access-log", default=["on"], type=access_log_settings,
                    help="server.access_log of the served runs: on, off, or each in turn as on,off")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = args.dir / args.shape
    if args.child:
        print(json.dumps(CHILDREN[args.child](root, args)))
        return
    build(root, args.shape)
    if args.build_only:
        return
    from appliance.engine.host import Host

    host = Host.read()
    rows = []
    quantizations = args.quantization.split(",")
    for run in args.runs.split(","):
        for quantization in quantizations if run in ("ours", "served") else ["none"]:
            for access_log in args.access_log if run == "served" else ["on"]:
                started = time.perf_counter()
                args.quantization = quantization
                result = served(root, args, access_log) if run == "served" else run_child(run, root, args)
                short = {k: v for k, v in result.items() if k not in ("token_ids", "logprobs")}
                name = (run + (" int8" if quantization == "int8" else "")
                        + (f" log {access_log}" if run == "served" and len(args.access_log) > 1 else ""))
                print(f"{name}: {json.dumps(short)} ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
                      flush=True)
                rows.append((name, result))
    flags = " ".join(f for f in NATIVE_FLAGS if f in host.cpu_flags) or "none of " + " ".join(NATIVE_FLAGS)
    mode = (", quick" if args.quick else "") + (", start-up only" if args.startup_only else "")
    print(f"\nreal_scale ({args.shape}{mode}); "
          f"CPU flags: {flags}; {os.cpu_count()} CPUs; threads {args.threads or 'default'}; "
          f"{host.memory_available / 2 ** 30:.1f} of {host.memory_total / 2 ** 30:.1f} GiB available")
    print(table(rows))
    for name, r in rows:
        if "error" in r:
            print(f"{name} failed: {r['error']}")
    decoded = [r for name, r in rows if "logprobs" in r]
    if len(decoded) == 2:
        print(f"{decoded[1]['dtype']} against {decoded[0]['dtype']}: {drift(*decoded)}")


if __name__ == "__main__":
    main()
