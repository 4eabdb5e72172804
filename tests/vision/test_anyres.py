"""LLaVA-NeXT anyres: tiles match transformers' processor, and the token count matches both the
processor's placeholder expansion and what the model's feature packing produces."""
import random
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from appliance.errors import ConfigError
from appliance.vision.anyres import (AnyresConfig, anyres_preprocess, fit_within, grid_shape,
                                     llava_next_feature_count, select_pinpoint)
from appliance.vision.clip_preprocess import ClipPreprocessConfig

from .helpers import LLAVA_NEXT, PINPOINTS, SIZES, noise, photo_like, reference_processor

TOL = 0.02
NEXT = AnyresConfig()  # llava-hf/llava-v1.6-*: 336 tiles, patch 14, "default"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tiles_match_transformers(size):
    cfg = ClipPreprocessConfig.from_dict(LLAVA_NEXT)
    processor = reference_processor(LLAVA_NEXT)
    for make in (photo_like, noise):
        image = make(*size)
        ref = processor(image, return_tensors="pt")
        ours = anyres_preprocess(image, cfg)
        assert ours.pixel_values.shape == ref["pixel_values"][0].shape
        assert list(ours.image_size) == ref["image_sizes"][0].tolist() == [size[1], size[0]]
        diff = (ours.pixel_values - ref["pixel_values"][0]).abs().max().item()
        assert diff < TOL, (size, make.__name__, diff)
        rows, cols = ours.grid
        assert ours.pixel_values.shape[0] == 1 + rows * cols
        assert ours.grid == grid_shape(ours.image_size, NEXT)


@pytest.mark.parametrize("hw,expected", [
    ((768, 1024), (672, 672)),    # 4:3 landscape: the 2x2 grid keeps the most pixels
    ((336, 672), (336, 672)),     # exactly a pinpoint
    ((300, 1000), (336, 1008)),   # wide strip: 1x3
    ((1000, 300), (1008, 336)),   # tall strip: 3x1
    ((10, 10), (336, 672)),       # everything upscales fully: least waste, first on ties
    ((500, 500), (672, 672)),
    ((40, 2000), (336, 1008)),
])
def test_select_pinpoint(hw, expected):
    assert select_pinpoint(hw, PINPOINTS) == expected


@pytest.mark.parametrize("hw,target,expected", [
    ((768, 1024), (672, 672), (504, 672)),
    ((1024, 768), (672, 672), (672, 504)),
    ((333, 999), (336, 1008), (336, 1008)),  # 999 * (336/333) rounds just above 1008: capped
    ((1, 1), (336, 672), (336, 336)),
    ((3, 7), (336, 672), (288, 672)),        # ceil(3 * 96) = 288
])
def test_fit_within(hw, target, expected):
    assert fit_within(hw, target) == expected


@pytest.mark.parametrize("hw,grid,count", [
    ((768, 1024), (2, 2), 576 + 36 * 48 + 36),   # 2340: 6 padding rows cut top and bottom
    ((336, 672), (1, 2), 576 + 24 * 48 + 24),    # exact fit: no padding
    ((672, 672), (2, 2), 576 + 48 * 48 + 48),
    ((500, 300), (2, 1), 576 + 40 * 24 + 40),    # 2x1 grid is 48x24; content 500*24/300 = 40 rows
])
def test_feature_count_table(hw, grid, count):
    assert grid_shape(hw, NEXT) == grid
    assert llava_next_feature_count(hw, NEXT) == count


def _many_sizes():
    rng = random.Random(0)
    sizes = [(h, w) for (w, h) in SIZES] + [(336, 336), (672, 336), (1008, 336), (335, 1009), (2, 1000)]
    sizes += [(rng.randint(1, 1600), rng.randint(1, 1600)) for _ in range(40)]
    sizes += [(rng.randint(20, 80), rng.randint(600, 1600)) for _ in range(8)]  # strips, both ways
    sizes += [(w, h) for (h, w) in sizes[-8:]]
    return sizes


def _text_processor():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlavaNextProcessor, PreTrainedTokenizerFast

    vocab = Tokenizer(models.WordLevel({"<unk>": 0, "<image>": 1}, unk_token="<unk>"))
    vocab.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=vocab, unk_token="<unk>",
                                        extra_special_tokens={"image_token": "<image>"})
    # llava-hf's processor_config: patch_size 14, "default" strategy, 1 extra (CLS) token
    return LlavaNextProcessor(image_processor=reference_processor(LLAVA_NEXT), tokenizer=tokenizer,
                              patch_size=14, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1)


def test_feature_count_equals_processor_expansion():
    processor = _text_processor()
    for h, w in _many_sizes():
        out = processor(text="<image>", images=Image.new("RGB", (w, h)), return_tensors="pt")
        expanded = int((out["input_ids"] == 1).sum())
        assert llava_next_feature_count((h, w), NEXT) == expanded, (h, w)


def test_feature_count_equals_model_packing():
    """The count must equal the rows the model's pack_image_features emits for those tiles."""
    from transformers.models.llava_next.modeling_llava_next import LlavaNextModel

    model = SimpleNamespace(config=SimpleNamespace(
        vision_config=SimpleNamespace(image_size=336, patch_size=14), image_grid_pinpoints=PINPOINTS))
    for h, w in _many_sizes():
        rows, cols = grid_shape((h, w), NEXT)
        features = [torch.zeros(1 + rows * cols, 576, 1)]  # "default": CLS already dropped
        _, lengths = LlavaNextModel.pack_image_features(model, features, torch.tensor([[h, w]]), "default",
                                                        image_newline=torch.zeros(1))
        assert llava_next_feature_count((h, w), NEXT) == int(lengths[0]), (h, w)


def test_full_strategy_keeps_cls():
    full = AnyresConfig(feature_select_strategy="full")
    assert llava_next_feature_count((768, 1024), full) == llava_next_feature_count((768, 1024), NEXT) + 1


def test_config_from_model_config_and_errors():
    cfg = AnyresConfig.from_model_config({"image_grid_pinpoints": PINPOINTS, "vision_feature_select_strategy":
                                          "default", "vision_config": {"image_size": 336, "patch_size": 14}})
    assert cfg == NEXT
    with pytest.raises(ConfigError, match="vision_feature_select_strategy"):
        AnyresConfig(feature_select_strategy="cls")
    with pytest.raises(ConfigError, match="image_grid_pinpoints"):
        AnyresConfig(grid_pinpoints=((100, 672),))
    with pytest.raises(ConfigError, match="multiples"):
        anyres_preprocess(photo_like(50, 50), ClipPreprocessConfig.from_dict(
            {**LLAVA_NEXT, "image_grid_pinpoints": [[336, 500]]}))
    with pytest.raises(ConfigError, match="image_grid_pinpoints"):
        anyres_preprocess(photo_like(50, 50), ClipPreprocessConfig.from_dict(
            {k: v for k, v in LLAVA_NEXT.items() if k != "image_grid_pinpoints"}))
