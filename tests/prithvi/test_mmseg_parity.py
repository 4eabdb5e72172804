"""Parity with hls-foundation-os, the Prithvi-EO-1.0 fine-tunes' reference (mmseg: TemporalViTEncoder,
ConvTransformerTokensToEmbeddingNeck, FCNHead): our conv_transpose_fcn layout on the golden mmcv checkpoint
(tests/fixtures/prithvi_mmseg_golden/, made by scripts/make_prithvi_mmseg_golden.py) gives the reference's
logits from the raw 18-band chips through our own normalisation and date-major reshape, and the configs of
the three published fine-tunes build exactly the reference's key set and shapes."""
import json

import numpy as np
import pytest
import rasterio
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from appliance.config.compose import compose
from appliance.config.schema import PrithviConfig
from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi
from appliance.engine.models.prithvi.loader import normalize_state_dict, read_checkpoint
from appliance.errors import ConfigError

from tests.conftest import REPO, run_cli

from .helpers import GOLDEN, model_cfg
from .test_parity import TOL

MMSEG = GOLDEN.parent / "prithvi_mmseg_golden"
STACKED = REPO / "appliance" / "assets" / "samples" / "crops_sample_stacked.tif"
CROP_BANDS = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]
PUBLISHED_CONFIGS = {"crops": "prithvi_eo1_100m_crops", "sen1floods11": "prithvi_eo1_100m_flood",
                     "burn_scars": "prithvi_eo1_100m_burn_scars"}


def golden_prithvi(**overrides):
    meta = json.loads((MMSEG / "meta.json").read_text())
    return OmegaConf.merge(OmegaConf.structured(PrithviConfig), meta["prithvi"], overrides)


def our_tiles(chips: torch.Tensor) -> torch.Tensor:
    """The raw date-major 18-band chips as our pipeline tiles them: [B, C, T, H, W], each band normalised
    with conf/model/geo/hls_crops.yaml's reflectance scale, means and stds."""
    geo = compose(["pipeline=prithvi_crops"]).model.geo
    b, _, h, w = chips.shape
    tiles = chips.reshape(b, 3, 6, h, w).transpose(1, 2) * geo.scale
    means = torch.tensor(list(geo.means)).view(1, 6, 1, 1, 1)
    stds = torch.tensor(list(geo.stds)).view(1, 6, 1, 1, 1)
    return (tiles - means) / stds


def test_mmcv_checkpoint_gives_the_references_logits_from_raw_chips():
    model = load_prithvi(model_cfg(golden_prithvi(), MMSEG / "checkpoint.pth", CROP_BANDS))
    ref = load_file(str(MMSEG / "reference.safetensors"))
    tiles = our_tiles(ref["chips"])
    with torch.no_grad():
        logits = model(tiles)
        # The reference's own model input, given straight (no reshape): the same logits.
        model.date_major = False
        straight = model(ref["input"])
    assert logits.shape == ref["logits"].shape
    assert (straight - ref["logits"]).abs().max().item() < TOL
    assert (logits - ref["logits"]).abs().max().item() < TOL
    # Without the declared reshape the model sees bands where it was trained on dates: another answer.
    with torch.no_grad():
        unshuffled = model(tiles)
    assert (unshuffled - ref["logits"]).abs().max().item() > 100 * TOL


def test_the_neck_orders_each_patchs_channels_by_embedding_then_frame():
    """A frame-order mistake in the neck would survive T = 1; swapping two frames of the reference input
    must change the logits, and our model must follow the reference there too (one frame zeroed)."""
    model = load_prithvi(model_cfg(golden_prithvi(date_major_reshape=False), MMSEG / "checkpoint.pth", CROP_BANDS))
    ref = load_file(str(MMSEG / "reference.safetensors"))
    x = ref["input"].clone()
    with torch.no_grad():
        base = model(x)
        x[:, :, 1] = 0
        changed = model(x)
    assert (base - ref["logits"]).abs().max().item() < TOL
    assert (changed - base).abs().max().item() > 100 * TOL


def test_training_only_heads_and_metadata_are_dropped_but_other_keys_must_match():
    state = normalize_state_dict(read_checkpoint(str(MMSEG / "checkpoint.pth")))
    assert not any(k.startswith("auxiliary_head.") for k in state)
    assert any(k.startswith("decode_head.convs.0.bn.") for k in state)
    cfg = model_cfg(golden_prithvi(head_convs=2), MMSEG / "checkpoint.pth", CROP_BANDS)
    with pytest.raises(ConfigError, match=r"missing \(\d+\): decode_head\.convs\.1\."):
        load_prithvi(cfg)


@pytest.mark.parametrize("fine_tune", sorted(PUBLISHED_CONFIGS))
def test_published_fine_tune_configs_build_the_reference_key_set(fine_tune):
    """The configs for ibm-nasa-geospatial's Prithvi-EO-1.0 crop, flood and burn scars checkpoints build
    every key of the reference's model at its shape (auxiliary head aside), so the real files load."""
    reference = json.loads((MMSEG / "published_keys.json").read_text())[fine_tune]
    expected = {k: v for k, v in reference.items() if not k.startswith("auxiliary_head.")}
    pipeline = "prithvi_flood" if fine_tune == "sen1floods11" else f"prithvi_{fine_tune}"
    model_config = compose([f"pipeline={pipeline}", f"model={PUBLISHED_CONFIGS[fine_tune]}"]).model
    with torch.device("meta"):
        model = build_prithvi_segmentation(model_config.prithvi, in_chans=len(model_config.geo.bands))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == expected


def test_numpy_metadata_is_read(tmp_path):
    """An mmcv checkpoint's meta holds numpy scalars (an EvalHook's best score): read as plain values."""
    path = tmp_path / "mmcv.pth"
    torch.save({"meta": {"best": np.float64(0.5), "n": np.int64(3)}, "state_dict": {"w": torch.ones(1)}}, path)
    assert list(read_checkpoint(str(path))) == ["w"]


def test_the_pipeline_feeds_the_published_crop_layout_as_it_was_trained(tmp_path):
    """`appliance run pipeline=prithvi_crops model=prithvi_eo1_100m_crops` with the golden checkpoint (its
    small sizes given on the command line) on the stacked sample, in 64-pixel tiles without overlap: every
    tile without nodata is the argmax of the reference-equivalent model on that tile's raw chip."""
    sizes = golden_prithvi()
    out = tmp_path / "crops.tif"
    result = run_cli(
        "run", "pipeline=prithvi_crops", "model=prithvi_eo1_100m_crops", f"model.checkpoint={MMSEG / 'checkpoint.pth'}",
        *(f"model.prithvi.{key}={sizes[key]}" for key in ("embed_dim", "depth", "num_heads", "img_size",
                                                          "neck_channels", "decoder_channels")),
        "pipeline.stages.tile.tile_size=64", "pipeline.stages.tile.overlap=0", "pipeline.stages.stitch.progress=false",
        f"input={STACKED}", f"output={out}", timeout=300, env={"OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    with rasterio.open(STACKED) as src:
        chip = torch.from_numpy(src.read().astype(np.float32))
    with rasterio.open(out) as written:
        classes = written.read(1)
    model = load_prithvi(model_cfg(sizes, MMSEG / "checkpoint.pth", CROP_BANDS))
    checked = 0
    for top in range(0, classes.shape[0], 64):
        for left in range(0, classes.shape[1], 64):
            got = classes[top : top + 64, left : left + 64]
            if (got == 255).any():
                continue
            with torch.no_grad():
                logits = model(our_tiles(chip[None, :, top : top + 64, left : left + 64]))
            assert (logits[0].argmax(0).numpy() == got).mean() > 0.999
            checked += 1
    assert checked == 5  # of the sample's 12 tiles, 5 hold no nodata pixel
