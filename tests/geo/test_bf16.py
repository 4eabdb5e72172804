"""The flood pipeline in bfloat16 draws the masks it draws in float32 (engine.dtype=auto picks bf16 for a
half precision checkpoint on a CPU with bf16 units): the embedded demo model on the bundled sample and on
synthetic scenes, per-class IoU of the two masks >= 0.99."""
import numpy as np
import rasterio

from scripts.synthetic_scenes import write_scene
from tests.conftest import REPO, run_cli

SAMPLE = REPO / "appliance" / "assets" / "samples" / "flood_sample.tif"
SCENE_SEEDS = (4242, 7, 11)  # 4242: the demo model's held-out scene
NODATA_CLASS = 255


def masks(inputs, out_dir, dtype):
    out_dir.mkdir()
    result = run_cli("run", "pipeline=prithvi_flood", "input=[" + ",".join(map(str, inputs)) + "]",
                     f"output={out_dir}", f"engine.dtype={dtype}", timeout=600, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    out = []
    for path in inputs:
        with rasterio.open(out_dir / f"{path.stem}.mask.tif") as f:
            out.append(f.read(1))
    return out


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = (a | b).sum()
    return 1.0 if union == 0 else float((a & b).sum() / union)


def test_bf16_masks_match_fp32(tmp_path):
    scenes = tmp_path / "scenes"
    scenes.mkdir()
    inputs = [SAMPLE]
    for seed in SCENE_SEEDS:
        write_scene(scenes / f"scene_{seed}.tif", seed=seed)
        inputs.append(scenes / f"scene_{seed}.tif")
    fp32, bf16 = masks(inputs, tmp_path / "fp32", "float32"), masks(inputs, tmp_path / "bf16", "bfloat16")
    for path, a, b in zip(inputs, fp32, bf16):
        assert ((a == NODATA_CLASS) == (b == NODATA_CLASS)).all(), path.name
        for cls in (0, 1):
            score = iou(a == cls, b == cls)
            assert score >= 0.99, f"{path.name}: class {cls} IoU {score:.4f} between bf16 and fp32 masks"
