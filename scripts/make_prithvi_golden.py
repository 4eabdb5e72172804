"""Make the Prithvi parity fixture (tests/fixtures/prithvi_golden/) with terratorch's own modules.

terratorch is never a dependency of the project: run this in a throwaway environment, e.g.

    python3 -m venv /tmp/tt-venv
    /tmp/tt-venv/bin/pip install torch==2.14.1 torchvision==0.29.1   # from the machine's local wheels
    /tmp/tt-venv/bin/pip install terratorch                          # 1.2.11 when the fixture was made
    /tmp/tt-venv/bin/python scripts/make_prithvi_golden.py
    /tmp/tt-venv/bin/python scripts/make_prithvi_golden.py --frames 3   # tests/fixtures/prithvi_golden_t3/

It builds a small Prithvi-EO-2.0 TL segmentation model exactly as terratorch's EncoderDecoderFactory does
for Sen1Floods11 (same architecture as tiny-TL, smaller: embed 96, 3 heads, depth 4, UperNet with 64
channels), fills every weight and BatchNorm statistic with seeded random values rounded to float16 (so the
float16 file holds the exact float32 weights and the fixture stays small), and writes:

- checkpoint.pt: `{"state_dict": {"model.<key>": tensor}, ...}`, a Lightning task checkpoint in
  terratorch's current key layout (`model.neck.2.fpn*`);
- reference.safetensors: input [2, 6, 57, 75] (needs reflect padding to 64x96, a non-square 4x6 token
  grid and a resized position table), the coordinates, terratorch's logits with and without coordinates,
  and terratorch's resized position table for that grid; plus a [1, 6, 32, 128] input (a 2x8 grid) with
  terratorch's logits as built (its neck reshapes those 16 tokens as 4x4) and with the grid height given;
- meta.json: the config, the input description and the versions used.

It also rebuilds the model in the older layout (UperNetDecoder with scale_modules, keys `decoder.fpn*`),
loads the same weights and checks that both layouts give the same logits.

With --frames T (> 1) it writes the multi-date fixture instead: the same model with num_frames T (the
neck's effective_time_dim T), input [2, 6, T, 57, 75], each sample's T dates, terratorch's logits with and
without coordinates and with the dates reversed (`main_frames`).
"""
import argparse
import json
import platform
from pathlib import Path

import numpy as np
import torch

BANDS = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]
CONFIG = {
    "embed_dim": 96,
    "depth": 4,
    "num_heads": 3,
    "patch_size": 16,
    "tubelet_size": 1,
    "num_frames": 1,
    "img_size": 224,
    "mlp_ratio": 4.0,
    "coords_encoding": ["time", "location"],
    "coords_scale_learn": True,
    "selected_indices": [0, 1, 2, 3],
    "decoder_channels": 64,
    "num_classes": 2,
}
HEAD_DROPOUT = 0.1
SEED = 1234
INPUT_SHAPE = (2, 6, 57, 75)
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
WIDE_SHAPE = (1, 6, 32, 128)  # a 2x8 token grid: 16 tokens, which terratorch's neck takes for 4x4


def build_reference(old_layout: bool, frames: int = 1) -> torch.nn.Module:
    from terratorch.models.encoder_decoder_factory import EncoderDecoderFactory

    necks = [{"name": "SelectIndices", "indices": CONFIG["selected_indices"]},
             {"name": "ReshapeTokensToImage", **({"effective_time_dim": frames} if frames > 1 else {})}]
    extra = {"decoder_scale_modules": True} if old_layout else {}
    if not old_layout:
        necks.append({"name": "LearnedInterpolateToPyramidal"})
    return EncoderDecoderFactory().build_model(
        task="segmentation",
        backbone="prithvi_eo_v2_tiny_tl",
        backbone_pretrained=False,
        backbone_bands=BANDS,
        backbone_embed_dim=CONFIG["embed_dim"],
        backbone_depth=CONFIG["depth"],
        backbone_num_heads=CONFIG["num_heads"],
        backbone_coords_encoding=CONFIG["coords_encoding"],
        backbone_coords_scale_learn=CONFIG["coords_scale_learn"],
        **({"backbone_num_frames": frames} if frames > 1 else {}),
        necks=necks,
        decoder="UperNetDecoder",
        decoder_channels=CONFIG["decoder_channels"],
        head_dropout=HEAD_DROPOUT,
        num_classes=CONFIG["num_classes"],
        rescale=True,
        **extra,
    )


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Seeded values for every float tensor (BatchNorm statistics and coordinate scales included)."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point() or name.endswith("pos_embed"):
                continue
            def rnd(scale, t=t):
                return torch.randn(t.shape, generator=gen) * scale
            if name.endswith("running_mean"):
                new = rnd(0.1)
            elif name.endswith("running_var"):
                new = 0.5 + torch.rand(t.shape, generator=gen)
            elif name.endswith(".scale"):
                new = 0.2 + 0.6 * torch.rand(t.shape, generator=gen)
            elif name.endswith("bias"):
                new = rnd(0.05)
            elif name.endswith("weight") and t.dim() == 1:  # LayerNorm / BatchNorm
                new = 1.0 + rnd(0.1)
            elif name == "head.head.2.weight":
                new = t * 8.0  # logits of order 1, so that the 1e-4 parity tolerance is tight
            else:
                new = t.clone()  # terratorch's own initialisation of this weight
            t.copy_(new.half().float())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=1, help="dates a sample (num_frames); >1: the multi-date fixture")
    parser.add_argument("--out", default=None,
                        help="default tests/fixtures/prithvi_golden, or prithvi_golden_t<frames>")
    args = parser.parse_args()
    if args.frames > 1:
        return main_frames(args.frames, Path(args.out or FIXTURES / f"prithvi_golden_t{args.frames}"))
    out = Path(args.out or FIXTURES / "prithvi_golden")
    out.mkdir(parents=True, exist_ok=True)

    import timm
    from importlib.metadata import version
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    model = build_reference(old_layout=False).eval()
    randomize(model, torch.Generator().manual_seed(SEED))
    state = model.state_dict()

    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(INPUT_SHAPE, generator=gen)
    temporal = torch.tensor([[[2018.0, 196.0]], [[2021.0, 32.0]]])
    location = torch.tensor([[-15.3, 27.9], [44.8, -93.2]])  # (lat, lon)

    with torch.no_grad():
        logits = model(x, temporal_coords=temporal, location_coords=location).output
        logits_no_coords = model(x).output
        padded = (64, 96)
        pos = model.encoder.interpolate_pos_encoding((1, *padded))

        # ReshapeTokensToImage guesses the grid as sqrt(tokens) whenever that is an integer, which is
        # wrong for a 2x8 grid; record its output and the output with the grid height given (h=2).
        wide = torch.randn(WIDE_SHAPE, generator=gen)
        wide_default = model(wide).output
        model.neck[1].h = WIDE_SHAPE[2] // 16
        wide_fixed = model(wide).output
        model.neck[1].h = None

        old = build_reference(old_layout=True).eval()
        renamed = {k.replace("neck.2.fpn", "decoder.fpn"): v for k, v in state.items()}
        old.load_state_dict(renamed, strict=True)
        old_logits = old(x, temporal_coords=temporal, location_coords=location).output
    old_diff = (old_logits - logits).abs().max().item()
    assert old_diff < 1e-5, f"old and new terratorch layouts disagree by {old_diff}"
    assert logits.shape == (INPUT_SHAPE[0], CONFIG["num_classes"], *INPUT_SHAPE[2:]), logits.shape

    ckpt = {
        "state_dict": {f"model.{k}": (v.half() if v.is_floating_point() else v) for k, v in state.items()},
        "epoch": 0,
        "global_step": 0,
    }
    torch.save(ckpt, out / "checkpoint.pt")
    save_file(
        {
            "input": x.contiguous(),
            "temporal_coords": temporal,
            "location_coords": location,
            "logits": logits.contiguous(),
            "logits_no_coords": logits_no_coords.contiguous(),
            "pos_embed_4x6": pos.contiguous(),
            "wide_input": wide.contiguous(),
            "wide_logits_grid_given": wide_fixed.contiguous(),
            "wide_logits_terratorch_default": wide_default.contiguous(),
        },
        str(out / "reference.safetensors"),
    )
    meta = {
        "prithvi": CONFIG,
        "bands": BANDS,
        "in_chans": len(BANDS),
        "head_dropout": HEAD_DROPOUT,
        "seed": SEED,
        "input_shape": list(INPUT_SHAPE),
        "padded_shape": list(padded),
        "token_grid": [1, padded[0] // 16, padded[1] // 16],
        "weights": "seeded random values rounded to float16, stored as float16 (exact in float32)",
        "reference_pipeline": "terratorch EncoderDecoderFactory: prithvi_eo_v2_tiny_tl backbone (embed/depth/heads "
        "overridden), necks SelectIndices + ReshapeTokensToImage + LearnedInterpolateToPyramidal, "
        "UperNetDecoder, SegmentationHead(dropout 0.1), eval mode, float32 on CPU",
        "wide_input_shape": list(WIDE_SHAPE),
        "wide_note": "terratorch's ReshapeTokensToImage takes a 2x8 grid for 4x4 (sqrt of 16 tokens); "
        "wide_logits_grid_given passes h=2 to it, wide_logits_terratorch_default does not",
        "old_layout_max_abs_diff": old_diff,
        "logits_abs_max": logits.abs().max().item(),
        "versions": {
            "terratorch": version("terratorch"),
            "torch": torch.__version__,
            "timm": timm.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "command": "python scripts/make_prithvi_golden.py (in a throwaway venv with terratorch)",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("old_layout_max_abs_diff", "logits_abs_max", "versions")}, indent=2))


def main_frames(frames: int, out: Path) -> None:
    """The multi-date fixture: the same small model with `frames` dates a sample (num_frames, and the neck's
    effective_time_dim folding them into channels), input [2, 6, frames, 57, 75], its dates and places,
    terratorch's logits with and without them."""
    import timm
    from importlib.metadata import version
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    CONFIG["num_frames"] = frames
    torch.manual_seed(SEED)
    model = build_reference(old_layout=False, frames=frames).eval()
    randomize(model, torch.Generator().manual_seed(SEED))
    gen = torch.Generator().manual_seed(SEED + 1)
    shape = (INPUT_SHAPE[0], INPUT_SHAPE[1], frames, *INPUT_SHAPE[2:])
    x = torch.randn(shape, generator=gen)
    temporal = torch.tensor([[[2018.0, 196.0 + 16 * t] for t in range(frames)],
                             [[2021.0, 32.0 + 40 * t] for t in range(frames)]])
    location = torch.tensor([[-15.3, 27.9], [44.8, -93.2]])
    with torch.no_grad():
        logits = model(x, temporal_coords=temporal, location_coords=location).output
        logits_no_coords = model(x).output
        reordered = model(x[:, :, list(reversed(range(frames)))]).output
    assert logits.shape == (shape[0], CONFIG["num_classes"], *shape[3:]), logits.shape
    ckpt = {"state_dict": {f"model.{k}": (v.half() if v.is_floating_point() else v)
                           for k, v in model.state_dict().items()}, "epoch": 0, "global_step": 0}
    torch.save(ckpt, out / "checkpoint.pt")
    save_file({"input": x.contiguous(), "temporal_coords": temporal, "location_coords": location,
               "logits": logits.contiguous(), "logits_no_coords": logits_no_coords.contiguous(),
               "logits_dates_reversed": reordered.contiguous()}, str(out / "reference.safetensors"))
    meta = {
        "prithvi": CONFIG, "bands": BANDS, "in_chans": len(BANDS), "head_dropout": HEAD_DROPOUT, "seed": SEED,
        "input_shape": list(shape),
        "weights": "seeded random values rounded to float16, stored as float16 (exact in float32)",
        "reference_pipeline": f"terratorch EncoderDecoderFactory: prithvi_eo_v2_tiny_tl backbone with num_frames "
        f"{frames} (embed/depth/heads overridden), necks SelectIndices + ReshapeTokensToImage(effective_time_dim="
        f"{frames}) + LearnedInterpolateToPyramidal, UperNetDecoder, SegmentationHead(dropout 0.1), eval mode, "
        "float32 on CPU",
        "logits_abs_max": logits.abs().max().item(),
        "versions": {"terratorch": version("terratorch"), "torch": torch.__version__, "timm": timm.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "command": f"python scripts/make_prithvi_golden.py --frames {frames} (in a throwaway venv with terratorch)",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("logits_abs_max", "versions")}, indent=2))


if __name__ == "__main__":
    main()
