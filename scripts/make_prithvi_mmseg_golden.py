"""Make the Prithvi-EO-1.0 parity fixture (tests/fixtures/prithvi_mmseg_golden/) with the reference's own code.

The published Prithvi-EO-1.0 fine-tunes (multi-temporal crop classification, Sen1Floods11, burn scars) were
trained with NASA-IMPACT/hls-foundation-os: mmsegmentation 0.x, its `TemporalEncoderDecoder`,
`TemporalViTEncoder` and `ConvTransformerTokensToEmbeddingNeck`, and mmseg's `FCNHead`. None of that is a
dependency of the project: run this once in a throwaway environment, e.g.

    python3 -m venv /tmp/mm-venv
    /tmp/mm-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm==0.4.12 einops rasterio rioxarray safetensors \
        numpy addict yapf==0.40.1 "setuptools<70" opencv-python-headless prettytable scipy matplotlib
    MMCV_WITH_OPS=0 /tmp/mm-venv/bin/pip install --no-build-isolation mmcv==1.7.2
    /tmp/mm-venv/bin/pip install --no-deps mmsegmentation==0.30.0
    git clone https://github.com/NASA-IMPACT/hls-foundation-os /tmp/hlsfm     # 04468b0 made the fixture
    /tmp/mm-venv/bin/python scripts/make_prithvi_mmseg_golden.py --hls-foundation-os /tmp/hlsfm

mmcv is installed without its compiled ops (they need a CUDA/C++ build), and importing mmseg's model package
imports some of them (losses, point heads) by name; the script registers an empty `mmcv._ext` whose
functions raise if called. Nothing on the inference path (ConvModule, BatchNorm, FCNHead, resize) calls one.

It builds a small crop-classification model exactly as hls-foundation-os's
configs/multi_temporal_crop_classification.py does (3 dates x 6 bands, 13 classes, neck embed_dim =
output_embed_dim = embed_dim x 3, FCNHead with one conv, an auxiliary FCNHead with two), smaller: embed 48,
3 heads, depth 2, 64 x 64 pixels (4 x 4 patches), 32 head channels. Every weight and BatchNorm statistic is
a seeded random value rounded to float16. It writes:

- checkpoint.pth: mmcv's `save_checkpoint` file (`meta`, `state_dict` with `backbone.`/`neck.`/
  `decode_head.`/`auxiliary_head.` keys, `optimizer`), with the `meta` an mmseg run's EvalHook leaves
  (CLASSES, PALETTE, `hook_msgs.best_score` as a numpy float);
- reference.safetensors: two raw 18-band chips (date-major DN values, as the crop dataset's `_merged.tif`),
  the model input that the config's test pipeline makes of them (TorchNormalize with its 18 means and stds,
  then Reshape to (6, 3, H, W)), and the segmentor's `encode_decode` logits;
- published_keys.json: the state-dict key -> shape of the three published fine-tunes' models, built from
  their configs (crop: depth 6, 8 heads, 3 frames; Sen1Floods11 and burn scars: depth 12, 12 heads), so that
  the project's configs can be checked against the real checkpoints' layout without the weights;
- meta.json: the small model's config in the project's terms, the seeds and the versions used.
"""
import argparse
import json
import platform
import sys
import types
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SEED = 2024
FRAMES, BANDS, CLASSES, SIZE = 3, 6, 13, 64
EMBED, DEPTH, HEADS, HEAD_CHANNELS = 48, 2, 3, 32
# configs/multi_temporal_crop_classification.py's TorchNormalize: six HLS bands' DN means/stds, once per date.
MEANS = [494.905781, 815.239594, 924.335066, 2968.881459, 2634.621962, 1739.579917] * FRAMES
STDS = [284.925432, 357.84876, 575.566823, 896.601013, 951.900334, 921.407808] * FRAMES
PUBLISHED = {  # model facts of the published fine-tunes' configs in hls-foundation-os/configs/
    "crops": dict(frames=3, depth=6, heads=8, embed=768, out=768 * 3, classes=13),
    "sen1floods11": dict(frames=1, depth=12, heads=12, embed=768, out=768, classes=2),
    "burn_scars": dict(frames=1, depth=12, heads=12, embed=768, out=768, classes=2),
}


def register_missing_mmcv_ops() -> None:
    """An `mmcv._ext` whose every function raises: mmseg imports compiled ops by name, inference calls none."""
    def unused(*args, **kwargs):
        raise RuntimeError("a compiled mmcv op was called")

    def lookup(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return unused

    ext = types.ModuleType("mmcv._ext")
    ext.__getattr__ = lookup
    sys.modules["mmcv._ext"] = ext


def model_config(frames, depth, heads, embed, out, classes, size=224, head_channels=256):
    """hls-foundation-os's crop/flood/burn-scar model dict, with the given sizes."""
    head = dict(type="FCNHead", num_classes=classes, in_channels=out, in_index=-1, channels=head_channels,
                concat_input=False, dropout_ratio=0.1, norm_cfg=dict(type="BN", requires_grad=True),
                align_corners=False, loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False))
    return dict(
        type="TemporalEncoderDecoder",
        frozen_backbone=False,
        backbone=dict(type="TemporalViTEncoder", pretrained=None, img_size=size, patch_size=16, num_frames=frames,
                      tubelet_size=1, in_chans=BANDS, embed_dim=embed, depth=depth, num_heads=heads, mlp_ratio=4.0,
                      norm_pix_loss=False),
        neck=dict(type="ConvTransformerTokensToEmbeddingNeck", embed_dim=embed * frames, output_embed_dim=out,
                  drop_cls_token=True, Hp=size // 16, Wp=size // 16),
        decode_head=dict(head, num_convs=1),
        auxiliary_head=dict(head, num_convs=2),
        train_cfg=dict(),
        test_cfg=dict(mode="whole"),
    )


def build(cfg):
    from mmcv import ConfigDict
    from mmseg.models import build_segmentor

    return build_segmentor(ConfigDict(cfg))


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Seeded values for every float tensor but the fixed position table, rounded to float16."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point() or name.endswith("pos_embed"):
                continue
            if name.endswith("running_mean"):
                new = torch.randn(t.shape, generator=gen) * 0.1
            elif name.endswith("running_var"):
                new = 0.5 + torch.rand(t.shape, generator=gen)
            elif name.endswith("bias"):
                new = torch.randn(t.shape, generator=gen) * 0.05
            elif t.dim() == 1:  # LayerNorm / BatchNorm weight
                new = 1.0 + torch.randn(t.shape, generator=gen) * 0.1
            else:
                fan_in = t[0].numel() if t.dim() > 1 else t.numel()
                new = torch.randn(t.shape, generator=gen) / fan_in ** 0.5
            t.copy_(new.half().float())


def reference_input(chip: np.ndarray) -> torch.Tensor:
    """The crop config's test pipeline after loading: channels-first tensor, TorchNormalize, Reshape."""
    from geospatial_fm.geospatial_pipelines import Reshape, TorchNormalize

    results = {"img": torch.from_numpy(chip)}
    results = TorchNormalize(MEANS, STDS)(results)
    results = Reshape(keys=["img"], new_shape=(BANDS, FRAMES, -1, -1), look_up={"2": 1, "3": 2})(results)
    return results["img"]


def published_keys() -> dict:
    """{fine-tune: {key: shape}} of the published models, built (random weights) from their configs."""
    out = {}
    for name, facts in PUBLISHED.items():
        model = build(model_config(**facts))
        out[name] = {k: list(v.shape) for k, v in model.state_dict().items()}
        del model
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hls-foundation-os", required=True, help="a checkout of NASA-IMPACT/hls-foundation-os")
    parser.add_argument("--out", default=str(FIXTURES / "prithvi_mmseg_golden"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    register_missing_mmcv_ops()
    sys.path.insert(0, args.hls_foundation_os)
    import geospatial_fm  # noqa: F401  registers TemporalEncoderDecoder, TemporalViTEncoder and the neck
    import mmcv
    import mmseg
    from importlib.metadata import version
    from mmcv.runner import save_checkpoint
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    model = build(model_config(FRAMES, DEPTH, HEADS, EMBED, EMBED * FRAMES, CLASSES, SIZE, HEAD_CHANNELS)).eval()
    randomize(model, torch.Generator().manual_seed(SEED))

    rng = np.random.default_rng(SEED + 1)
    means, stds = np.array(MEANS, np.float32), np.array(STDS, np.float32)
    chips = (means[None, :, None, None] + stds[None, :, None, None]
             * rng.standard_normal((2, BANDS * FRAMES, SIZE, SIZE), dtype=np.float32)).round().clip(0, 10000)
    x = torch.stack([reference_input(c) for c in chips.astype(np.float32)])
    metas = [dict(ori_shape=(SIZE, SIZE), img_shape=(SIZE, SIZE), pad_shape=(SIZE, SIZE), flip=False)] * 2
    with torch.no_grad():
        logits = model.encode_decode(x, metas)
    assert logits.shape == (2, CLASSES, SIZE, SIZE), logits.shape

    optimizer = torch.optim.Adam(model.parameters(), lr=1.5e-5)
    meta = dict(CLASSES=[f"class_{i}" for i in range(CLASSES)], PALETTE=[[i, i, i] for i in range(CLASSES)],
                epoch=80, iter=1000, hook_msgs=dict(best_score=np.float64(0.5), last_ckpt="epoch_80.pth"))
    save_checkpoint(model, str(out / "checkpoint.pth"), optimizer=optimizer, meta=meta)
    save_file({"chips": torch.from_numpy(chips.astype(np.float32)), "input": x.contiguous(),
               "logits": logits.contiguous()}, str(out / "reference.safetensors"))
    (out / "published_keys.json").write_text(json.dumps(published_keys(), indent=0))
    (out / "meta.json").write_text(json.dumps({
        "prithvi": {"embed_dim": EMBED, "depth": DEPTH, "num_heads": HEADS, "patch_size": 16, "num_frames": FRAMES,
                    "img_size": SIZE, "decoder": "conv_transpose_fcn", "neck_channels": EMBED * FRAMES,
                    "decoder_channels": HEAD_CHANNELS, "head_convs": 1, "num_classes": CLASSES,
                    "date_major_reshape": True},
        "seed": SEED,
        "chips": "2 x 18 bands (3 dates x 6 HLS bands, date-major) x 64 x 64 DN values: means + stds * N(0, 1), "
                 "rounded, clipped to 0..10000",
        "reference_pipeline": "hls-foundation-os TorchNormalize(18 means, stds) + Reshape((6, 3, -1, -1)), then "
                              "TemporalEncoderDecoder.encode_decode (backbone, neck, FCNHead, bilinear resize), "
                              "eval mode, float32 on CPU",
        "logits_abs_max": logits.abs().max().item(),
        "versions": {"torch": torch.__version__, "mmcv": mmcv.__version__, "mmsegmentation": mmseg.__version__,
                     "timm": version("timm"), "hls-foundation-os": "04468b0", "python": platform.python_version()},
    }, indent=2) + "\n")
    print(f"wrote {out}: logits max |{logits.abs().max().item():.3f}|")


if __name__ == "__main__":
    main()
