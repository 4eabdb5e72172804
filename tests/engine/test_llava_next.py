"""LLaVA-NeXT (anyres) on our engine against transformers' LlavaNextForConditionalGeneration.

Tiny random model: 28 px tiles of 7 px patches (4x4 features a tile), pinpoints up to 3 tiles a side.
Per image: pixel_values [1 + rows*cols, 3, 28, 28] (random; the same tensors for HF and us),
image_size (height, width), and llava_next_feature_count placeholders.
"""
import pytest
import torch

from appliance.config.schema import EngineConfig
from appliance.engine.llm_engine import LLMEngine
from appliance.engine.multimodal import ImageItem
from appliance.anyres_plan import AnyresConfig, grid_shape, llava_next_feature_count
from tests.engine.helpers import assert_no_block_leaks, build_tokenizer
from tests.engine.test_llava import (IMAGE_TOKEN, compare, hf_greedy_vlm, random_pixels, run_engine,
                                     save_vlm, tiny_text, tiny_vision)

PINPOINTS = [[28, 56], [56, 28], [56, 56], [28, 84], [84, 28]]
SIZES = [(20, 50), (50, 20), (30, 30), (100, 37), (37, 100), (28, 28), (60, 45), (15, 90), (90, 14), (33, 61)]


@pytest.fixture(scope="module")
def next_dir(tmp_path_factory):
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration
    path = tmp_path_factory.mktemp("llava_next")
    tok = build_tokenizer(str(path))
    cfg = LlavaNextConfig(vision_config=tiny_vision(28, 7), text_config=tiny_text(len(tok)),
                          image_token_id=IMAGE_TOKEN, image_grid_pinpoints=PINPOINTS)
    return save_vlm(path, LlavaNextForConditionalGeneration, cfg, seed=3)


def anyres_config(model_dir):
    from transformers import AutoConfig
    return AnyresConfig.from_model_config(AutoConfig.from_pretrained(model_dir).to_dict())


def next_image(cfg: AnyresConfig, i: int, size):
    rows, cols = grid_shape(size, cfg)
    pixels = random_pixels(200 + i, (1 + rows * cols, 3, cfg.tile_size, cfg.tile_size))
    return f"next{i}", pixels, size, llava_next_feature_count(size, cfg)


def next_request(texts, images, seed):
    g = torch.Generator().manual_seed(seed)
    ids, items = [], []
    for i, n in enumerate(texts):
        ids += torch.randint(3, IMAGE_TOKEN, (n,), generator=g).tolist()
        if i < len(images):
            h, pixels, size, count = images[i]
            items.append(ImageItem(h, len(ids), count, pixel_values=pixels, image_size=size))
            ids += [IMAGE_TOKEN] * count
    return ids, items


def next_hf_inputs(items):
    if not items:
        return {}
    return {"pixel_values": torch.cat([it.pixel_values for it in items]),
            "image_sizes": torch.tensor([list(it.image_size) for it in items])}


def next_requests(model_dir):
    cfg = anyres_config(model_dir)
    imgs = [next_image(cfg, i, s) for i, s in enumerate(SIZES)]
    layouts = [([3, 5], [imgs[0]]), ([0, 9], [imgs[1]]), ([12, 1], [imgs[2]]), ([2, 4, 6], [imgs[3], imgs[4]]),
               ([1, 0], [imgs[5]]), ([20, 3], [imgs[6]]), ([7, 2], [imgs[7]]), ([5, 2, 1], [imgs[8], imgs[9]]),
               ([6], [])]
    return [next_request(texts, ims, i) for i, (texts, ims) in enumerate(layouts)]


@pytest.fixture(scope="module")
def next_refs(next_dir):
    from transformers import LlavaNextForConditionalGeneration
    requests = next_requests(next_dir)
    return requests, hf_greedy_vlm(next_dir, LlavaNextForConditionalGeneration, requests, next_hf_inputs)


def test_greedy_batch_matches_hf(next_dir, next_refs):
    requests, refs = next_refs
    engine = LLMEngine(next_dir, EngineConfig(num_kv_blocks=256))
    compare(refs, run_engine(engine, requests))
    assert engine.stats()["encoder_cache_misses"] == len(SIZES)
    assert_no_block_leaks(engine)


def test_packing_matches_transformers(next_dir):
    """Our per-image embeddings equal HF's get_image_features (base + unpadded grid + newlines)."""
    from transformers import LlavaNextForConditionalGeneration
    ref = LlavaNextForConditionalGeneration.from_pretrained(next_dir, dtype=torch.float32).eval()
    engine = LLMEngine(next_dir, EngineConfig(num_kv_blocks=16))
    ours = engine.executor.runner.model
    cfg = anyres_config(next_dir)
    for i, size in enumerate(SIZES):
        h, pixels, size, count = next_image(cfg, i, size)
        with torch.no_grad():
            sizes = torch.tensor([list(size)])
            expected = ref.model.get_image_features(pixels, image_sizes=sizes).pooler_output[0]
            got = ours.image_embeddings(ImageItem(h, 0, count, pixel_values=pixels, image_size=size))
        assert got.shape == expected.shape == (count, 64), size
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_splits_images(next_dir, next_refs):
    requests, refs = next_refs
    engine = LLMEngine(next_dir, EngineConfig(num_kv_blocks=256, max_num_batched_tokens=13))
    compare(refs, run_engine(engine, requests))
    assert engine.stats()["num_chunked_prefills"] > 0
    assert engine.stats()["encoder_cache_misses"] == len(SIZES)
    assert_no_block_leaks(engine)


def test_image_features_input_matches_pixels(next_dir, next_refs):
    requests, refs = next_refs
    engine = LLMEngine(next_dir, EngineConfig(num_kv_blocks=256))
    model = engine.executor.runner.model
    with torch.no_grad():
        feat_requests = [(ids, [ImageItem(it.content_hash + "-f", it.offset, it.num_tokens, image_size=it.image_size,
                                          features=model.vision_features(it.pixel_values)) for it in items])
                         for ids, items in requests]
    compare(refs, run_engine(engine, feat_requests))
    assert_no_block_leaks(engine)


def test_bad_items_are_refused_at_add(next_dir):
    engine = LLMEngine(next_dir, EngineConfig(num_kv_blocks=16))
    cfg = anyres_config(next_dir)
    h, pixels, size, count = next_image(cfg, 0, (20, 50))  # 1x2 tiles
    ids = [5] + [IMAGE_TOKEN] * count
    with pytest.raises(ValueError, match="image_size"):
        engine.add_request(ids, mm_data=[ImageItem(h, 1, count, pixel_values=pixels)])
    with pytest.raises(ValueError, match=r"base view \+ 2x2 tiles"):  # a square image wants 2x2
        engine.add_request(ids, mm_data=[ImageItem(h, 1, count, pixel_values=pixels, image_size=(30, 30))])
    with pytest.raises(ValueError, match=f"makes {count} image embeddings"):
        engine.add_request(ids + [IMAGE_TOKEN], mm_data=[ImageItem(h, 1, count + 1, pixel_values=pixels,
                                                                   image_size=size)])
    assert not engine.has_unfinished()
