"""Time to first token (TTFT) of LLaVA requests on a repeated image: encoder cache on vs off.

    .venv/bin/python benchmarks/llava_ttft.py --threads 1     # 3 rounds of 6 requests per setting
    .venv/bin/python benchmarks/llava_ttft.py --quick         # 1 round of 3 requests per setting

Bench model: a LLaVA-1.5 checkpoint with random weights, fp32, written to a temp dir (`--model-dir DIR`
keeps it for the next run). The vision tower has CLIP's real input: image 336, patch 14, so 576 image
tokens; hidden 768, 12 layers, 12 heads, MLP 3072 (ViT-B width; ViT-L/14-336's 24 layers of 1024 are
too slow on this CPU), feature layer -2 (11 layers run). Projector 768 -> 512 -> 512. Language model:
Llama hidden 512, intermediate 1408, 4 layers, 8 heads, vocab 32000.

Two engines, identical but for `engine.encoder_cache_bytes` (256 MiB vs 0); prefix caching is off in
both, so only the encoder cache differs. Each round takes a new image: its first request, then repeats
with the same image and different prompts (LLaVA-1.5 layout: `USER: <image>\\n{prompt} ASSISTANT:`).
Rounds alternate between the engines. Requests run one at a time through `LLMEngine.add_request` /
`step`; TTFT runs from `add_request` to the step that returns the request's first token. Each engine
first serves one warm-up request (its own image), which is not counted.
"""
import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch

VOCAB = 32000
IMAGE_TOKEN = VOCAB - 1  # a word prompts never use: prompt ids are drawn from [3, IMAGE_TOKEN)
CLIP_336 = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336},
            "crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "resample": 3,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}


def build_model(path: str, tower_hidden: int, tower_layers: int) -> None:
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        PreTrainedTokenizerFast,
    )

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w2", bos_token="w1", unk_token="w0").save_pretrained(path)
    vision = CLIPVisionConfig(image_size=336, patch_size=14, hidden_size=tower_hidden,
                              intermediate_size=4 * tower_hidden, num_hidden_layers=tower_layers,
                              num_attention_heads=tower_hidden // 64, projection_dim=512)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                       bos_token_id=1, eos_token_id=2)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN)
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(CLIP_336, f)


def make_image(path: str, seed: int):
    """(content hash, pixel values [3, 336, 336]) as the chat stages make them."""
    from appliance.vision.clip_preprocess import clip_preprocess, load_preprocess_config
    from appliance.vision.image_load import content_hash
    from image_preprocess import photo_like  # the benchmarks' photo stand-in (run from benchmarks/)

    image = photo_like(seed, 640, 480)
    return content_hash(image), clip_preprocess(image, load_preprocess_config(path))


def make_request(image, num_tokens: int, seed: int):
    """`USER: <image>\\n{prompt} ASSISTANT:` as token ids (a prompt of 16-48 random words) + its ImageItem."""
    from appliance.engine.multimodal import ImageItem

    rng = np.random.default_rng(seed)
    user, prompt, assistant = (rng.integers(3, IMAGE_TOKEN, n).tolist() for n in (3, int(rng.integers(16, 49)), 4))
    ids = [1] + user + [IMAGE_TOKEN] * num_tokens + prompt + assistant
    content_hash, pixels = image
    return ids, ImageItem(content_hash, 1 + len(user), num_tokens, pixel_values=pixels)


def ttft(engine, request, params) -> float:
    """Seconds from add_request to the first token; the request then runs to its end (not timed)."""
    ids, item = request
    start = time.perf_counter()
    rid = engine.add_request(ids, params, mm_data=[item])
    first = None
    while engine.has_unfinished():
        for out in engine.step():
            if first is None and out.request_id == rid and out.new_token_ids:
                first = time.perf_counter() - start
    return first


def encoder_counts(engine) -> tuple:
    s = engine.stats()
    return s["encoder_cache_hits"], s["encoder_cache_misses"]


def summary(values):
    """(mean, median, p99) in seconds; p99 interpolates linearly (with few samples it is near the max)."""
    return statistics.mean(values), statistics.median(values), float(np.percentile(values, 99))


def tower_seconds(engine, image, repeat: int = 3) -> float:
    """Best of `repeat`: vision tower + projector for one image, outside the engine."""
    from appliance.engine.multimodal import ImageItem

    model = engine.executor.runner.model
    item = ImageItem("tower-timing", 0, model.view_tokens(model.config), pixel_values=image[1])
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        with torch.inference_mode():
            model.embed_images([item])
        best = min(best, time.perf_counter() - start)
    return best


def run(args, path: str) -> None:
    from transformers import AutoConfig

    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.models.llava import LlavaForConditionalGeneration
    from appliance.engine.sampling_params import SamplingParams

    num_tokens = LlavaForConditionalGeneration.view_tokens(AutoConfig.from_pretrained(path))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    settings = {"on": EngineConfig().encoder_cache_bytes, "off": 0}  # the default budget vs none
    engines = {name: LLMEngine(path, EngineConfig(dtype="float32", enable_prefix_caching=False,
                                                  kv_cache_memory_bytes=64 * 2 ** 20, encoder_cache_bytes=budget))
               for name, budget in settings.items()}
    for i, engine in enumerate(engines.values()):  # warm-up, not counted
        ttft(engine, make_request(make_image(path, 1000 + i), num_tokens, 1000 + i), params)
    counts = {name: encoder_counts(engine) for name, engine in engines.items()}
    times = {(name, kind): [] for name in settings for kind in ("first", "repeat")}
    for r in range(args.rounds):
        image = make_image(path, r)
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            for k in range(args.requests):
                seconds = ttft(engines[name], make_request(image, num_tokens, 100 * r + k), params)
                times[name, "first" if k == 0 else "repeat"].append(seconds)
    tower = tower_seconds(engines["on"], make_image(path, 2000))
    print(f"\nTTFT, {args.rounds} round(s) x {args.requests} requests per setting "
          f"(1 first + {args.requests - 1} repeats of the round's image), prefix caching off; "
          f"{num_tokens} image tokens + 24-56 text tokens per prompt\n")
    print("| encoder cache | requests | n | mean s | median s | p99 s | encoder cache hits / misses |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, budget in settings.items():
        hits, misses = (a - b for a, b in zip(encoder_counts(engines[name]), counts[name]))
        label = f"{name} ({budget // 2 ** 20} MiB)" if budget else "off (0)"
        for kind in ("first", "repeat"):
            values = times[name, kind]
            if values:
                mean, median, p99 = summary(values)
                print(f"| {label} | {kind} | {len(values)} | {mean:.3f} | {median:.3f} | {p99:.3f} | "
                      f"{f'{hits} / {misses}' if kind == 'first' else ''} |")
    on, off = times["on", "repeat"], times["off", "repeat"]
    if on and off:
        print(f"\nrepeats, median TTFT: cache off / cache on = {statistics.median(off) / statistics.median(on):.2f}x; "
              f"off - on = {statistics.median(off) - statistics.median(on):.3f} s")
    print(f"vision tower + projector alone, one image (best of 3): {tower:.3f} s")
    for engine in engines.values():
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="images; each is sent --requests times per setting")
    ap.add_argument("--requests", type=int, default=6, help="requests per round: the first + repeats")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--tower-hidden", type=int, default=768)
    ap.add_argument("--tower-layers", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-dir", help="reuse (or create) the bench checkpoint here")
    ap.add_argument("--quick", action="store_true", help="1 round of 3 requests per setting")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 3
    if args.requests < 2:
        ap.error("--requests must be >= 2 (the first request and at least one repeat)")
    torch.set_num_threads(args.threads)
    print(f"machine: {platform.machine()} {_cpu_name()}, {os.cpu_count()} CPUs; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model_dir or os.path.join(tmp, "llava_bench")
        if not os.path.exists(os.path.join(path, "config.json")):
            start = time.perf_counter()
            build_model(path, args.tower_hidden, args.tower_layers)
            print(f"built the bench checkpoint in {path} ({time.perf_counter() - start:.0f} s)")
        start = time.perf_counter()
        run(args, path)
    print(f"load average {os.getloadavg()[0]:.2f} at end; the run took {time.perf_counter() - start:.0f} s")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
