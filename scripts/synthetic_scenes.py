#!/usr/bin/env python
"""Synthetic 6-band HLS-like flood scenes with labels, deterministic from (seed, height, width).

Bands (descriptions in the file): BLUE, GREEN, RED, NIR_NARROW, SWIR_1, SWIR_2, as int16 DN =
reflectance x 10000, nodata -9999, UTM CRS and a 30 m grid. Surfaces: water (dark in NIR/SWIR,
blue/green slightly above NIR), vegetation (bright NIR), bare soil (bright SWIR), urban (flat,
moderately bright), clouds (bright in all bands, soft edges) and nodata patches.
Labels (uint8): 0 land, 1 water, 255 nodata (no input, or cloud opacity > 0.5).

    from synthetic_scenes import make_scene, write_scene   # tests, training scripts
    python scripts/synthetic_scenes.py out.tif --height 300 --width 400 --seed 1 --labels out_labels.tif
    python scripts/synthetic_scenes.py --sample             # refresh appliance/assets/samples/
"""
import argparse
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

BANDS = ("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")
NODATA_DN = -9999
LAND, WATER, NODATA_LABEL = 0, 1, 255
# Surface reflectance per band (BLUE..SWIR_2), typical of HLS.
SIGNATURES = {
    "water": (0.070, 0.060, 0.040, 0.030, 0.015, 0.010),
    "vegetation": (0.030, 0.065, 0.040, 0.350, 0.180, 0.090),
    "soil": (0.080, 0.120, 0.160, 0.250, 0.320, 0.250),
    "urban": (0.100, 0.110, 0.120, 0.180, 0.200, 0.170),
    "cloud": (0.550, 0.550, 0.560, 0.580, 0.400, 0.300),
}
SAMPLE = Path(__file__).resolve().parents[1] / "appliance" / "assets" / "samples" / "flood_sample.tif"


def smooth_field(rng: np.random.Generator, height: int, width: int, cell: float) -> np.ndarray:
    """Zero-mean, unit-ish smooth noise: a random grid every `cell` pixels, smoothstep-interpolated."""
    gh, gw = int(height / cell) + 3, int(width / cell) + 3
    grid = rng.standard_normal((gh, gw))
    ys, xs = np.arange(height) / cell, np.arange(width) / cell
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = ys - y0, xs - x0
    fy, fx = fy * fy * (3 - 2 * fy), fx * fx * (3 - 2 * fx)
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy[:, None]) + bottom * fy[:, None]


def make_scene(height: int = 300, width: int = 400, seed: int = 0, *, clouds: bool = True,
               nodata: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(dn int16 [6, H, W], labels uint8 [H, W]); the same arguments always give the same arrays."""
    rng = np.random.default_rng([seed, height, width])
    scale = max(8.0, min(height, width) / 6)
    terrain = smooth_field(rng, height, width, scale) + 0.5 * smooth_field(rng, height, width, scale / 3)
    wet = smooth_field(rng, height, width, scale * 1.3) + 0.3 * smooth_field(rng, height, width, scale / 4)
    water = wet > np.quantile(wet, 0.88)
    # A meandering river across the scene.
    yy, xx = np.mgrid[0:height, 0:width]
    phase, centre = rng.uniform(0, 2 * np.pi), rng.uniform(0.3, 0.7) * height
    path = centre + 0.15 * height * np.sin(xx / max(width, 1) * 2 * np.pi * 1.5 + phase)
    water |= np.abs(yy - path) < max(1.5, height / 60)

    surfaces = ("vegetation", "urban", "soil", "water")
    kinds = np.zeros((height, width), dtype=np.uint8)
    kinds[terrain > np.quantile(terrain, 0.55)] = 1
    kinds[terrain > np.quantile(terrain, 0.75)] = 2
    kinds[water] = 3
    table = np.asarray([SIGNATURES[s] for s in surfaces]).T  # [band, surface]
    texture = 1 + 0.08 * smooth_field(rng, height, width, max(4.0, scale / 5))
    reflectance = table[:, kinds] * texture
    reflectance += rng.normal(0, 0.0025, reflectance.shape)

    labels = np.where(water, WATER, LAND).astype(np.uint8)
    if clouds:
        sky = smooth_field(rng, height, width, scale * 0.8)
        opacity = np.clip((sky - np.quantile(sky, 0.94)) / 0.4, 0, 1)
        reflectance = (1 - opacity) * reflectance + opacity * np.asarray(SIGNATURES["cloud"])[:, None, None]
        labels[opacity > 0.5] = NODATA_LABEL
    dn = np.clip(np.round(reflectance * 10000), 0, 32767).astype(np.int16)
    if nodata:
        missing = np.zeros((height, width), dtype=bool)
        for _ in range(2):  # two rectangular gaps
            h, w = max(1, height // 8), max(1, width // 10)
            y, x = rng.integers(0, max(1, height - h)), rng.integers(0, max(1, width - w))
            missing[y:y + h, x:x + w] = True
        missing |= xx + yy < min(height, width) // 6  # a swath edge in the top-left corner
        dn[:, missing] = NODATA_DN
        labels[missing] = NODATA_LABEL
    return dn, labels


def write_scene(path, height: int = 300, width: int = 400, seed: int = 0, *, labels_path=None,
                crs: Optional[str] = "EPSG:32615", clouds: bool = True, nodata: bool = True) -> Path:
    """Write the scene (and optionally its labels) as tiled, compressed GeoTIFFs; returns `path`."""
    import rasterio
    from affine import Affine

    dn, labels = make_scene(height, width, seed, clouds=clouds, nodata=nodata)
    grid = Affine(30.0, 0.0, 500000.0, 0.0, -30.0, 3300000.0)  # 30 m UTM pixels
    profile = dict(driver="GTiff", height=height, width=width, crs=crs, transform=grid,
                   compress="deflate", predictor=2, zlevel=9)
    if height >= 16 and width >= 16:
        profile.update(tiled=True, blockxsize=min(256, 16 * (width // 16)), blockysize=min(256, 16 * (height // 16)))
    with rasterio.open(path, "w", count=len(BANDS), dtype="int16", nodata=NODATA_DN, **profile) as dst:
        dst.write(dn)
        for band, name in enumerate(BANDS, 1):
            dst.set_band_description(band, name)
    if labels_path is not None:
        with rasterio.open(labels_path, "w", count=1, dtype="uint8", nodata=NODATA_LABEL, **profile) as dst:
            dst.write(labels[None])
    return Path(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", help="scene GeoTIFF to write")
    parser.add_argument("--height", type=int, default=300)
    parser.add_argument("--width", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labels", help="also write the label raster here")
    parser.add_argument("--no-clouds", action="store_true")
    parser.add_argument("--no-nodata", action="store_true")
    parser.add_argument("--sample", action="store_true", help=f"write the packaged sample ({SAMPLE.name})")
    args = parser.parse_args(argv)
    if args.sample:
        SAMPLE.parent.mkdir(parents=True, exist_ok=True)
        labels = SAMPLE.with_name(SAMPLE.stem + "_labels.tif")
        write_scene(SAMPLE, 300, 400, seed=0, labels_path=labels)
        print(f"wrote {SAMPLE} ({SAMPLE.stat().st_size} bytes) and {labels}")
        return
    if not args.output:
        parser.error("give an output path or --sample")
    write_scene(args.output, args.height, args.width, args.seed, labels_path=args.labels,
                clouds=not args.no_clouds, nodata=not args.no_nodata)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
