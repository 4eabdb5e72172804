"""LLaVA-1.5 on our engine against transformers' LlavaForConditionalGeneration (tiny random models).

Pixel values are the same tensors for both; HF inputs are built by hand (expanded image tokens).
"""
import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.errors import ConfigError
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.models.llava import checkpoint_name
from appliance.engine.multimodal import ImageItem
from appliance.engine.sampling_params import SamplingParams
from tests.engine.helpers import assert_no_block_leaks, build_tokenizer, check_logprobs_close, greedy_reference

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
IMAGE_TOKEN = 399  # a token of the tiny tokenizer, so any sampled id detokenizes


def tiny_vision(image_size, patch_size):
    from transformers import CLIPVisionConfig
    return CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                            image_size=image_size, patch_size=patch_size, projection_dim=16)


def tiny_text(vocab_size):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       bos_token_id=1, eos_token_id=2)


def save_vlm(path, model_cls, config, seed=0):
    """Random weights (a larger init than HF's, for peaked, tie-free distributions) + the tokenizer."""
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and "vision_tower" not in name:
                p.normal_(0, 0.15)
            elif "image_newline" in name:
                p.normal_(0, 1.0)
    model.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def build_llava(path, image_size=56, patch_size=14, **extra):
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    tok = build_tokenizer(str(path))
    cfg = LlavaConfig(vision_config=tiny_vision(image_size, patch_size), text_config=tiny_text(len(tok)),
                      image_token_id=IMAGE_TOKEN, **extra)
    return save_vlm(path, LlavaForConditionalGeneration, cfg)


LLAVA_VARIANTS = {
    "layer-2_default": {},
    "layers_full": {"vision_feature_layer": [-3, -1], "vision_feature_select_strategy": "full"},
}


@pytest.fixture(scope="module", params=sorted(LLAVA_VARIANTS))
def llava_dir(request, tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp(f"llava_{request.param}"), **LLAVA_VARIANTS[request.param])


@pytest.fixture(scope="module")
def llava15_dir(tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp("llava15"))


# ---- requests ------------------------------------------------------------------------------------
def make_request(texts, images, tokens_per_image, seed):
    """Prompt text0 <img>*n text1 <img>*n ... and its ImageItems; `images` are (hash, pixels) pairs."""
    g = torch.Generator().manual_seed(seed)
    ids, items = [], []
    for i, n in enumerate(texts):
        ids += torch.randint(3, IMAGE_TOKEN, (n,), generator=g).tolist()
        if i < len(images):
            h, pixels = images[i]
            n_img = tokens_per_image(pixels) if callable(tokens_per_image) else tokens_per_image
            items.append(ImageItem(h, len(ids), n_img, pixel_values=pixels))
            ids += [IMAGE_TOKEN] * n_img
    return ids, items


def random_pixels(seed, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def run_engine(engine, requests, params=GREEDY):
    rids = [engine.add_request(ids, params, mm_data=items) for ids, items in requests]
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[r] for r in rids]


def hf_greedy_vlm(model_dir, model_cls, requests, hf_inputs, max_tokens=MAX_TOKENS, top_n=5):
    """The transformers reference for (prompt ids, image items) requests."""
    model = model_cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    return greedy_reference(model, [ids for ids, _ in requests], max_tokens, top_n,
                            [hf_inputs(items) for _, items in requests])


def compare(refs, outs):
    for i, ((ref_tokens, ref_lps), out) in enumerate(zip(refs, outs)):
        assert out.finished and out.finish_reason == "length"
        check_logprobs_close(ref_tokens, ref_lps, out.token_ids, out.logprobs, name=f"request {i}")


def llava_hf_inputs(items):
    return {"pixel_values": torch.stack([it.pixel_values for it in items])} if items else {}


def tokens_per_image(model_dir):
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(model_dir)
    n = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    return n + (1 if cfg.vision_feature_select_strategy == "full" else 0)


def llava_requests(model_dir, seed=0):
    """11 requests: 0-2 images at different places; repeated images across and within requests."""
    n = tokens_per_image(model_dir)
    from transformers import AutoConfig
    s = AutoConfig.from_pretrained(model_dir).vision_config.image_size
    imgs = [(f"img{i}", random_pixels(100 + i, (3, s, s))) for i in range(8)]
    layouts = [([3, 5], [imgs[0]]), ([0, 9], [imgs[1]]), ([12, 1], [imgs[2]]), ([2, 4, 6], [imgs[3], imgs[4]]),
               ([1, 0], [imgs[5]]), ([20, 3], [imgs[6]]), ([7], []), ([5, 2, 1], [imgs[7], imgs[0]]),
               ([30, 8], [imgs[0]]), ([4, 0, 0], [imgs[2], imgs[6]]), ([3, 20, 2], [imgs[4], imgs[4]])]
    return [make_request(texts, ims, n, seed + i) for i, (texts, ims) in enumerate(layouts)]


@pytest.fixture(scope="module")
def llava_refs(llava_dir):
    from transformers import LlavaForConditionalGeneration
    requests = llava_requests(llava_dir)
    return requests, hf_greedy_vlm(llava_dir, LlavaForConditionalGeneration, requests, llava_hf_inputs)


# ---- tests ---------------------------------------------------------------------------------------
def test_greedy_batch_matches_hf(llava_dir, llava_refs):
    requests, refs = llava_refs
    engine = LLMEngine(llava_dir, EngineConfig(num_kv_blocks=128))
    compare(refs, run_engine(engine, requests))
    stats = engine.stats()
    assert stats["encoder_cache_misses"] == 8  # 8 distinct images; the 5 repeats in other requests hit
    assert stats["encoder_cache_hits"] == 5  # (the last request's image twice is one lookup)
    assert_no_block_leaks(engine)


def test_chunked_prefill_splits_images(llava_dir, llava_refs):
    requests, refs = llava_refs
    engine = LLMEngine(llava_dir, EngineConfig(num_kv_blocks=128, max_num_batched_tokens=7))
    compare(refs, run_engine(engine, requests))
    stats = engine.stats()
    assert stats["num_chunked_prefills"] > 0
    assert stats["encoder_cache_misses"] == 8  # each image encoded once though split across chunks
    assert_no_block_leaks(engine)


def test_preemption_keeps_outputs_identical(llava_dir, llava_refs):
    requests, refs = llava_refs
    engine = LLMEngine(llava_dir, EngineConfig(num_kv_blocks=10, enable_prefix_caching=False))
    compare(refs, run_engine(engine, requests))
    assert engine.stats()["num_preemptions"] > 0
    assert_no_block_leaks(engine)


def test_prefix_cache_tells_images_apart(llava15_dir):
    from transformers import LlavaForConditionalGeneration
    n = tokens_per_image(llava15_dir)
    a = make_request([40, 3], [("imgA", random_pixels(1, (3, 56, 56)))], n, seed=5)
    b = make_request([40, 3], [("imgB", random_pixels(2, (3, 56, 56)))], n, seed=5)
    assert a[0] == b[0]  # identical token ids, different images
    refs = hf_greedy_vlm(llava15_dir, LlavaForConditionalGeneration, [a, b], llava_hf_inputs)
    assert refs[0][0] != refs[1][0]
    engine = LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=128, enable_prefix_caching=True))
    out_a = run_engine(engine, [a])
    out_b = run_engine(engine, [b])  # the text prefix before the image may hit; the image blocks must not
    compare(refs, out_a + out_b)
    hits_before = engine.stats()["prefix_cache_hit_tokens"]
    assert hits_before < 40 + n
    compare(refs[:1], run_engine(engine, [a]))  # same image again: its blocks are reused
    assert engine.stats()["prefix_cache_hit_tokens"] - hits_before >= 48
    assert_no_block_leaks(engine)


def test_image_features_input_matches_pixels(llava_dir, llava_refs):
    requests, refs = llava_refs
    engine = LLMEngine(llava_dir, EngineConfig(num_kv_blocks=128))
    model = engine.executor.runner.model
    feat_requests = []
    for ids, items in requests:
        with torch.no_grad():
            feats = [ImageItem(it.content_hash + "-f", it.offset, it.num_tokens,
                               features=model.vision_features(it.pixel_values[None])[0]) for it in items]
        feat_requests.append((ids, feats))
    compare(refs, run_engine(engine, feat_requests))
    assert_no_block_leaks(engine)


def test_tp2_matches_tp1(llava15_dir):
    requests = llava_requests(llava15_dir, seed=40)[:6]
    single = run_engine(LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=64)), requests)
    engine = LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=64, tensor_parallel_size=2))
    try:
        outs = run_engine(engine, requests)
        for i, (a, b) in enumerate(zip(single, outs)):
            check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"request {i}")
        assert_no_block_leaks(engine)
    finally:
        engine.close()


def run_each(engine, requests):
    """The requests one after another, each run to completion before the next is added."""
    return [run_engine(engine, [request])[0] for request in requests]


@pytest.mark.parametrize("budget, hits, misses", [
    (None, 6, 8),  # default (256 MiB): 11 requests, 8 distinct images; 5 repeats + the sequential one hit
    (0, 0, 14),  # no encoder cache: each (request, image) encoded again; a repeat within a prompt once
])
def test_encoder_cache_budget_from_config(llava15_dir, budget, hits, misses):
    from appliance.config.compose import compose

    requests = llava_requests(llava15_dir, seed=80)
    again = make_request([9, 4], [("img0", requests[0][1][0].pixel_values)], tokens_per_image(llava15_dir), 99)
    overrides = ["pipeline=llava_chat", f"model.path={llava15_dir}", "engine.num_kv_blocks=128",
                 "engine.enable_prefix_caching=false"]
    if budget is not None:
        overrides.append(f"engine.encoder_cache_bytes={budget}")
    reference = LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=128, enable_prefix_caching=False))
    expected = run_engine(reference, requests) + run_each(reference, [again])
    engine = LLMEngine.from_config(compose(overrides))
    outs = run_engine(engine, requests) + run_each(engine, [again])  # a batch, then the first image again
    for i, (a, b) in enumerate(zip(expected, outs)):
        assert a.token_ids == b.token_ids, f"request {i}"
        check_logprobs_close(a.token_ids, a.logprobs, b.token_ids, b.logprobs, name=f"request {i}")
    stats = engine.stats()
    assert (stats["encoder_cache_hits"], stats["encoder_cache_misses"]) == (hits, misses)
    assert stats["encoder_cache_budget_bytes"] == (256 * 1024 * 1024 if budget is None else 0)
    if budget == 0:
        assert (stats["encoder_cache_entries"], stats["encoder_cache_bytes"]) == (0, 0)
    assert_no_block_leaks(engine)


def test_negative_encoder_cache_budget_is_a_clear_error():
    """Refused when the config is built, before any engine or model."""
    with pytest.raises(ConfigError, match=r"^engine\.encoder_cache_bytes: -1; allowed: 0 or more \(0: no encoder"):
        EngineConfig(encoder_cache_bytes=-1)


def test_encoder_cache_budget_zero_keeps_nothing():
    from appliance.engine.encoder_cache import EncoderCache
    cache = EncoderCache(budget_bytes=0)
    calls = []
    for _ in range(2):
        cache.get_or_compute_many(["a"], lambda idx: calls.append("a") or [torch.zeros(10)])
    batches = []
    cache.get_or_compute_many(["a", "b", "a"], lambda idx: batches.append(idx) or [torch.zeros(10) for _ in idx])
    assert calls == ["a", "a"] and batches == [[0, 1, 2]]  # every lookup computed, repeats included
    assert (cache.hits, cache.misses, cache.evictions) == (0, 5, 0)
    assert (len(cache.entries), cache.used_bytes) == (0, 0)


def test_encoder_cache_lru_within_budget():
    from appliance.engine.encoder_cache import EncoderCache
    cache = EncoderCache(budget_bytes=2 * 4 * 10)  # two [10] float32 tensors
    calls = []

    def make(v):
        return lambda idx: calls.append(v) or [torch.zeros(10)]

    for key in ["a", "b", "a", "c", "b", "a"]:  # c evicts b (a was used more recently); b then evicts a
        cache.get_or_compute_many([key], make(key))
    assert calls == ["a", "b", "c", "b", "a"]
    assert (cache.hits, cache.misses, cache.evictions) == (1, 5, 3)
    assert cache.used_bytes <= cache.budget_bytes
    cache.get_or_compute_many(["big"], lambda idx: [torch.zeros(100)])  # larger than the budget: returned, not kept
    assert "big" not in cache.entries
    batches = []
    got = cache.get_or_compute_many(["a", "x", "x", "y"], lambda idx: batches.append(idx) or [
        torch.ones(10) * i for i in idx])  # a is cached; x and y are computed in one call, x once
    assert batches == [[1, 3]]
    assert [float(t[0]) for t in got] == [0.0, 1.0, 1.0, 3.0]
    assert (cache.hits, cache.misses) == (3, 8)


def test_wrong_placeholder_count_is_a_clear_error(llava15_dir):
    engine = LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=64))
    model = engine.executor.runner.model
    item = ImageItem("x", 0, 5, pixel_values=random_pixels(0, (3, 56, 56)))
    with pytest.raises(ValueError, match="16 image embeddings.*5 placeholder"):
        model.image_embeddings(item)
    five = [5] + [IMAGE_TOKEN] * 5
    with pytest.raises(ValueError, match="16 image embeddings.*5 placeholder"):  # refused before scheduling
        engine.add_request(five, GREEDY, mm_data=[item])
    with pytest.raises(ValueError, match=r"shape \(3, 28, 28\); this model takes \(3, 56, 56\)"):
        engine.add_request(five, GREEDY, mm_data=[ImageItem("y", 1, 5, pixel_values=torch.zeros(3, 28, 28))])
    with pytest.raises(ValueError, match="run of image tokens"):
        engine.add_request([5, 6, IMAGE_TOKEN, 7] + [IMAGE_TOKEN] * 15, GREEDY,
                           mm_data=[ImageItem("x", 2, 16, pixel_values=item.pixel_values)])
    with pytest.raises(ValueError, match="holds 1 image tokens.*covers 0"):  # image token, no image
        engine.add_request([5, IMAGE_TOKEN, 7], GREEDY)
    assert not engine.has_unfinished()


@pytest.mark.parametrize("name, ours", [
    ("language_model.model.layers.0.self_attn.q_proj.weight", "language_model.model.layers.0.self_attn.q_proj.weight"),
    ("model.language_model.layers.0.mlp.up_proj.weight", "language_model.model.layers.0.mlp.up_proj.weight"),
    ("language_model.lm_head.weight", "language_model.lm_head.weight"),
    ("lm_head.weight", "language_model.lm_head.weight"),
    ("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.bias",
     "vision_tower.encoder.layers.0.self_attn.q_proj.bias"),
    ("model.vision_tower.embeddings.patch_embedding.weight", "vision_tower.embeddings.patch_embedding.weight"),
    ("vision_tower.embeddings.class_embedding", "vision_tower.embeddings.class_embedding"),
    ("model.multi_modal_projector.linear_1.weight", "multi_modal_projector.linear_1.weight"),
    ("model.image_newline", "image_newline"),
    ("vision_tower.vision_model.embeddings.position_ids", None),
    ("language_model.model.layers.0.self_attn.rotary_emb.inv_freq", None),
])
def test_checkpoint_names(name, ours):
    assert checkpoint_name(name) == ours


def test_transformers4_layout_loads(llava15_dir, tmp_path):
    """The llava-hf (transformers 4.x) key layout: vision tower under vision_tower.vision_model."""
    import shutil

    from safetensors.torch import load_file, save_file
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(f"{llava15_dir}/{f}", tmp_path / f)
    sd = load_file(f"{llava15_dir}/model.safetensors")
    save_file({k.replace("vision_tower.", "vision_tower.vision_model.", 1)
               .replace("language_model.model.", "model.language_model.", 1): v for k, v in sd.items()},
              str(tmp_path / "model.safetensors"))
    requests = llava_requests(llava15_dir, seed=60)[:3]
    a = run_engine(LLMEngine(llava15_dir, EngineConfig(num_kv_blocks=64)), requests)
    b = run_engine(LLMEngine(str(tmp_path), EngineConfig(num_kv_blocks=64)), requests)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
