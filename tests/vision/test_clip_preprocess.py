"""Parity of our CLIP / LLaVA-1.5 preprocessing with transformers' processors, and config parsing."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from appliance.errors import ConfigError
from appliance.vision.clip_preprocess import (ClipPreprocessConfig, clip_preprocess, clip_preprocess_batch,
                                              load_preprocess_config, resize_output_hw)

from .helpers import CLIP_336, LLAVA_15_PAD, SIZES, noise, photo_like, reference_processor

TOL = 0.02  # normalised units; one 8-bit level is about 0.015


def reference(config, image):
    return reference_processor(config)(image, return_tensors="pt")["pixel_values"][0]


@pytest.mark.parametrize("config", [CLIP_336, LLAVA_15_PAD], ids=["clip", "llava15-pad"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matches_transformers(config, size):
    cfg = ClipPreprocessConfig.from_dict(config)
    for make in (photo_like, noise):
        image = make(*size)
        ours, ref = clip_preprocess(image, cfg), reference(config, image)
        assert ours.shape == ref.shape == (3, 336, 336) and ours.dtype == torch.float32
        diff = (ours - ref).abs().max().item()
        assert diff < TOL, (size, make.__name__, diff)
        assert diff < 1e-4  # same Pillow resize as the reference: only float rounding differs


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L", "P", "CMYK"])
def test_non_rgb_inputs_match_transformers(mode):
    image = photo_like(300, 200)
    if mode in ("RGBA", "LA"):
        image = image.convert("RGBA")
        alpha = Image.fromarray(np.tile(np.linspace(0, 255, 300, dtype=np.uint8), (200, 1)))
        image.putalpha(alpha)
    image = image.convert(mode)
    ours = clip_preprocess(image, ClipPreprocessConfig.from_dict(CLIP_336))
    assert (ours - reference(CLIP_336, image)).abs().max().item() < TOL


def test_exact_size_and_no_crop_options_match_transformers():
    config = {**CLIP_336, "size": {"height": 224, "width": 300}, "do_center_crop": False}
    image = photo_like(640, 480)
    ours = clip_preprocess(image, ClipPreprocessConfig.from_dict(config))
    ref = reference(config, image)
    assert ours.shape == ref.shape == (3, 224, 300)
    assert (ours - ref).abs().max().item() < TOL


def test_crop_larger_than_image_pads_black_like_transformers():
    config = {**CLIP_336, "size": {"height": 100, "width": 150}}  # crop 336 > 100x150
    image = photo_like(640, 480)
    ours = clip_preprocess(image, ClipPreprocessConfig.from_dict(config))
    assert (ours - reference(config, image)).abs().max().item() < TOL


def test_batch_is_the_stack_of_singles():
    cfg = ClipPreprocessConfig.from_dict(CLIP_336)
    images = [photo_like(*s, seed=i) for i, s in enumerate([(640, 480), (100, 900), (336, 336)])]
    batch = clip_preprocess_batch(images, cfg)
    assert batch.shape == (3, 3, 336, 336)
    assert torch.equal(batch, torch.stack([clip_preprocess(im, cfg) for im in images]))


@pytest.mark.parametrize("hw,expected", [
    ((768, 1024), (336, 448)),   # landscape: long side int(336 * 1024 / 768)
    ((1024, 768), (448, 336)),
    ((335, 337), (336, 338)),    # int(336 * 337 / 335) = 338 (338.006 truncated)
    ((40, 2000), (336, 16800)),
    ((1, 1), (336, 336)),
])
def test_resize_output_hw(hw, expected):
    assert resize_output_hw(*hw, ClipPreprocessConfig.from_dict(CLIP_336)) == expected


def test_config_keys_as_transformers_writes_them(tmp_path):
    cfg = ClipPreprocessConfig.from_dict(CLIP_336)
    assert (cfg.shortest_edge, cfg.crop_hw, cfg.resample, cfg.pad_to_square) == (336, (336, 336), 3, False)
    assert ClipPreprocessConfig.from_dict(LLAVA_15_PAD).pad_to_square
    assert ClipPreprocessConfig.from_dict(LLAVA_15_PAD).pad_color == (122, 116, 104)
    # NeXT's do_pad pads the tile count of a batch, not the image; CLIP has no pad option
    assert not ClipPreprocessConfig.from_dict({**CLIP_336, "image_processor_type": "LlavaNextImageProcessor",
                                               "do_pad": True}).pad_to_square
    assert not ClipPreprocessConfig.from_dict({**CLIP_336, "do_pad": True}).pad_to_square
    old = ClipPreprocessConfig.from_dict({"size": 224, "crop_size": 224})  # ints in old files
    assert (old.shortest_edge, old.crop_hw) == (224, (224, 224))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CLIP_336))
    assert load_preprocess_config(tmp_path) == cfg


@pytest.mark.parametrize("patch,fragment", [
    ({"size": {"longest_edge": 3}}, "size"),
    ({"size": {"shortest_edge": 336, "longest_edge": 672}}, "longest_edge"),
    ({"resample": [3]}, "resample"),
    ({"crop_size": {"height": 3}}, "crop_size"),
    ({"resample": 9}, "resample"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
    ({"image_std": [0.5, 0.0, 0.5]}, "image_std"),
    ({"do_resize": "yes"}, "do_resize"),
    ({"image_grid_pinpoints": [[336]]}, "image_grid_pinpoints"),
])
def test_bad_config_is_a_config_error(patch, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ClipPreprocessConfig.from_dict({**CLIP_336, **patch})


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_preprocess_config(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_preprocess_config(tmp_path)


@pytest.mark.parametrize("config", [CLIP_336, LLAVA_15_PAD], ids=["clip", "llava15-pad"])
def test_torch_resize_backend_is_close_but_not_exact(config):
    """The opt-in torch resize: same filter and pass order, different fixed-point rounding. Measured:
    at most 2 levels (0.03 normalised) on every shape, tall ones included; most pixels equal."""
    fast, exact = (ClipPreprocessConfig.from_dict(config, resize_backend=b) for b in ("torch", "pil"))
    for size in SIZES:
        image = photo_like(*size)
        diff = (clip_preprocess(image, fast) - clip_preprocess(image, exact)).abs()
        assert diff.mean().item() < 0.01, size
        assert diff.max().item() < 0.035, size  # <= 2 levels; 1 level is 1 / 255 / std ~ 0.015


@pytest.mark.parametrize("in_wh, out_wh", [
    ((363, 1113), (336, 1030)),   # tall photo: height shrinks by > 2x the width's shrink -> vertical first
    ((1113, 363), (1030, 336)),   # wide: horizontal first
    ((1024, 768), (448, 336)),    # shrinks 576 columns, 432 rows: horizontal first
    ((300, 1000), (200, 700)),    # 300 rows > 2 x 100 columns: vertical first
    ((300, 1000), (100, 700)),    # 300 rows = 1.5 x 200 columns: horizontal first
    ((50, 40), (100, 20)),        # width grows: vertical first
])
def test_torch_resize_runs_the_passes_in_pillows_order(in_wh, out_wh):
    """The order decides where the 8-bit clipping between passes falls: on white noise a wrong order
    is off by tens of levels. Pillow's one call must equal the two single-axis calls we mirror."""
    from appliance.vision.clip_preprocess import _pillow_pass_sizes, resize_image

    (w, h), (ow, oh) = in_wh, out_wh
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))
    passes = _pillow_pass_sizes(h, w, oh, ow)
    two_step = image
    for ph, pw in ([(oh, w), (oh, ow)] if len(passes) == 2 else [(h, ow), (oh, ow)]):
        two_step = two_step.resize((pw, ph), 3)
    assert np.array_equal(np.asarray(image.resize((ow, oh), 3)), np.asarray(two_step))
    ours = np.asarray(resize_image(image, (oh, ow), 3, backend="torch")).astype(int)
    assert np.abs(ours - np.asarray(two_step)).max() <= 2


    with pytest.raises(ConfigError, match="resize_backend"):
        ClipPreprocessConfig(resize_backend="cv2")
