"""Padding and cropping, input forms, and every conf/model Prithvi entry."""
import pytest
import torch

from appliance.config.compose import compose, group_options
from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi, save_safetensors
from appliance.engine.models.prithvi.model_input import pad_amounts

from .helpers import small_cfg


@pytest.mark.parametrize(
    "size, multiple, expected",
    [
        (64, 32, (0, 0)),  # already a multiple: no padding
        (57, 32, (3, 4)),  # odd total: the extra pixel goes after (bottom / right)
        (75, 32, (10, 11)),
        (33, 32, (15, 16)),
        (224, 28, (0, 0)),  # 600M: patch 14 -> multiple 28
        (225, 28, (13, 14)),
        (1, 32, (15, 16)),
    ],
)
def test_pad_amounts(size, multiple, expected):
    assert pad_amounts(size, multiple) == expected
    assert (size + sum(expected)) % multiple == 0


@pytest.fixture(scope="module")
def small_model():
    torch.manual_seed(0)
    return build_prithvi_segmentation(small_cfg(), in_chans=6).eval()


@pytest.mark.parametrize("h, w", [(32, 32), (33, 47), (57, 75), (64, 96), (95, 31), (17, 17)])
def test_odd_sizes_come_back_at_input_size(small_model, h, w):
    with torch.no_grad():
        out = small_model(torch.randn(2, 6, h, w))
    assert out.shape == (2, 2, h, w)
    assert torch.isfinite(out).all()


def test_padding_is_reflect_and_centred(small_model):
    x = torch.arange(57 * 75, dtype=torch.float32).reshape(1, 1, 1, 57, 75).expand(1, 6, 1, 57, 75)
    padded = small_model._pad(x)
    assert padded.shape[-2:] == (64, 96)
    top, left = 3, 10
    assert torch.equal(padded[..., top : top + 57, left : left + 75], x)
    assert torch.equal(padded[..., top - 1, left : left + 75], x[..., 1, :])  # reflect, edge not repeated


def test_cropped_logits_do_not_depend_on_where_the_padding_comes_from(small_model):
    """Logits of a 64x96 tile equal those of the same pixels when they are the padded input's centre."""
    x = torch.randn(1, 6, 57, 75)
    with torch.no_grad():
        small = small_model(x)
        full = small_model(small_model._pad(x.unsqueeze(2)))
    assert torch.allclose(full[..., 3:60, 10:85], small, atol=1e-5)


def test_too_small_input_is_refused(small_model):
    with pytest.raises(ValueError, match="too small"):
        small_model(torch.randn(1, 6, 8, 40))


def test_bad_rank_is_refused(small_model):
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        small_model(torch.randn(6, 32, 32))


def test_coords_are_optional_and_change_the_output(small_model):
    x = torch.randn(2, 6, 32, 32)
    temporal = torch.tensor([[[2020.0, 100.0]], [[2021.0, 250.0]]])
    location = torch.tensor([[10.0, 20.0], [-30.0, 140.0]])
    with torch.no_grad():
        plain = small_model(x)
        with_time = small_model(x, temporal_coords=temporal)
        with_both = small_model(x, temporal, location)
    assert not torch.allclose(plain, with_time)
    assert not torch.allclose(with_time, with_both)


def test_coords_are_ignored_by_models_without_coords_encoding():
    torch.manual_seed(0)
    model = build_prithvi_segmentation(small_cfg(coords_encoding=[], coords_scale_learn=False), 6).eval()
    x = torch.randn(1, 6, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), model(x, torch.tensor([[[2020.0, 1.0]]]), torch.tensor([[1.0, 2.0]])))


def test_bfloat16_forward_runs(small_model):
    model = build_prithvi_segmentation(small_cfg(), 6).eval().to(torch.bfloat16)
    with torch.no_grad():
        out = model(torch.randn(1, 6, 40, 40, dtype=torch.bfloat16), torch.tensor([[[2020.0, 1.0]]]),
                    torch.tensor([[1.0, 2.0]]))
    assert out.shape == (1, 2, 40, 40) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("indices", [[0, 1, 2], [0, 1, 2, 9], [-1, 0, 1, 5]])
def test_bad_selected_indices(indices):
    with pytest.raises(ValueError, match="selected_indices"):
        build_prithvi_segmentation(small_cfg(depth=4, selected_indices=indices), 6)


# name -> (encoder params in millions, lower, upper bound), patch size
PRITHVI_MODELS = {
    "prithvi_demo_flood": ((0.25, 0.35), 16),
    "prithvi_demo_burn_scars": ((0.25, 0.35), 16),
    "prithvi_demo_crops": ((0.25, 0.35), 16),
    "prithvi_tiny_tl_flood": ((5, 6.5), 16),
    "prithvi_100m_flood": ((85, 88), 16),
    "prithvi_300m_tl_flood": ((300, 306), 16),
    "prithvi_300m_burn_scars": ((300, 306), 16),
    "prithvi_300m_tl_crops": ((300, 306), 16),
    "prithvi_600m_tl_flood": ((625, 640), 14),
    "prithvi_eo1_100m_flood": ((85, 88), 16),
    "prithvi_eo1_100m_burn_scars": ((85, 88), 16),
    "prithvi_eo1_100m_crops": ((42, 45), 16),  # 6 blocks
}


def test_every_prithvi_config_is_listed_here():
    assert {m for m in group_options("model") if m.startswith("prithvi")} == set(PRITHVI_MODELS)


@pytest.mark.parametrize("name", sorted(PRITHVI_MODELS))
def test_config_builds_full_size_on_meta(name):
    cfg = compose([f"model={name}", "model.checkpoint=/unused.pt"]).model
    (low, high), patch = PRITHVI_MODELS[name]
    with torch.device("meta"):
        model = build_prithvi_segmentation(cfg.prithvi, len(cfg.geo.bands))
    encoder_params = sum(p.numel() for p in model.encoder.parameters()) / 1e6
    assert low <= encoder_params <= high, encoder_params
    assert model.encoder.patch_size == (1, patch, patch)
    if cfg.prithvi.decoder == "conv_transpose_fcn":  # hls-foundation-os's layout and key names
        assert model.pad_multiple == patch
        assert model.decode_head.conv_seg.out_channels == cfg.prithvi.num_classes
        assert [k for k in model.state_dict() if k.startswith("neck.")][0] == "neck.fpn1.0.weight"
    else:
        assert model.pad_multiple == 2 * patch
        assert model.head.head[2].out_channels == cfg.prithvi.num_classes
        assert [k for k in model.state_dict() if k.startswith("neck.")][0] == "neck.2.fpn1.0.weight"


@pytest.mark.parametrize("name", sorted(PRITHVI_MODELS))
def test_config_forward_shapes_at_small_size(name, tmp_path):
    """Real width, heads and patch of each entry; depth cut to 4 for the large ones to keep CPU time low."""
    cfg = compose([f"model={name}", f"model.checkpoint={tmp_path / 'w.safetensors'}"]).model
    if cfg.prithvi.depth > 12:
        cfg.prithvi.depth = 4
        cfg.prithvi.selected_indices = [0, 1, 2, 3]
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.prithvi, len(cfg.geo.bands)).eval()
    save_safetensors(model, cfg.checkpoint)
    loaded = load_prithvi(cfg)
    patch = cfg.prithvi.patch_size
    frames = cfg.prithvi.num_frames
    x = torch.randn(1, len(cfg.geo.bands), *([frames] if frames > 1 else []), 2 * patch + 3, 4 * patch - 5)
    days = [[2019.0, 180.0 + 30 * t] for t in range(frames)]
    coords = (torch.tensor([days]), torch.tensor([[45.0, 7.0]])) if cfg.prithvi.coords_encoding else ()
    with torch.no_grad():
        out = loaded(x, *coords)
        assert torch.allclose(out, model(x, *coords), atol=1e-5)
    assert out.shape == (1, cfg.prithvi.num_classes, *x.shape[-2:])
