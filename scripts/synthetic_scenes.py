#!/usr/bin/env python
"""Synthetic 6-band HLS-like scenes with labels, deterministic from (target, seed, height, width).

Bands (descriptions in the file): BLUE, GREEN, RED, NIR_NARROW, SWIR_1, SWIR_2, as int16 DN =
reflectance x 10000, nodata -9999, UTM CRS and a 30 m grid. Surfaces: water (dark in NIR/SWIR,
blue/green slightly above NIR), vegetation (bright NIR), bare soil (bright SWIR), urban (flat,
moderately bright), burn scars (dark NIR, bright SWIR: a low normalised burn ratio), clouds
(bright in all bands, soft edges) and nodata patches. Two targets:
- water (flood scenes): labels 0 land, 1 water;
- burn_scar (burn scenes: mostly vegetation, scars of varying severity, some soil, urban and a lake):
  labels 0 unburned, 1 burn scar;
both with 255 for nodata (no input, or cloud opacity > 0.5). A third target, crops, makes multi-date
scenes: rectangular fields of 13 crop and land-cover classes seen on three dates (CROP_CALENDARS), as
3 x 6 bands date-major; `write_crop_dates` writes them as one file per date (each with its
ACQUISITION_DATE tag) and as one stacked file.

    from synthetic_scenes import make_scene, write_scene   # tests, training scripts
    python scripts/synthetic_scenes.py out.tif --height 300 --width 400 --seed 1 --labels out_labels.tif
    python scripts/synthetic_scenes.py out.tif --target burn_scar --labels out_labels.tif
    python scripts/synthetic_scenes.py out.tif --target crops --labels out_labels.tif   # 18 bands, stacked
    python scripts/synthetic_scenes.py --sample             # refresh appliance/assets/samples/ (both targets)
"""
import argparse
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

BANDS = ("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")
NODATA_DN = -9999
LAND, WATER, NODATA_LABEL = 0, 1, 255
UNBURNED, BURN_SCAR = 0, 1
# Surface reflectance per band (BLUE..SWIR_2), typical of HLS.
SIGNATURES = {
    "water": (0.070, 0.060, 0.040, 0.030, 0.015, 0.010),
    "vegetation": (0.030, 0.065, 0.040, 0.350, 0.180, 0.090),
    "soil": (0.080, 0.120, 0.160, 0.250, 0.320, 0.250),
    "urban": (0.100, 0.110, 0.120, 0.180, 0.200, 0.170),
    "cloud": (0.550, 0.550, 0.560, 0.580, 0.400, 0.300),
    "burn": (0.045, 0.055, 0.070, 0.110, 0.210, 0.190),
}
SAMPLES_DIR = Path(__file__).resolve().parents[1] / "appliance" / "assets" / "samples"
SAMPLE = SAMPLES_DIR / "flood_sample.tif"
SAMPLES = {"water": SAMPLE, "burn_scar": SAMPLES_DIR / "burn_scars_sample.tif"}
CROPS_SAMPLE = SAMPLES_DIR / "crops_sample_stacked.tif"  # and crops_sample_date{1,2,3}.tif, crops_sample_labels.tif
CROPS_SAMPLE_SIZE = (192, 256)


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
               nodata: bool = True, target: str = "water") -> Tuple[np.ndarray, np.ndarray]:
    """(dn int16 [6, H, W], labels uint8 [H, W]); the same arguments always give the same arrays."""
    if target not in SURFACES:
        raise ValueError(f"target must be one of {sorted(SURFACES)} (got {target!r})")
    rng = np.random.default_rng([seed, height, width])
    scale = max(8.0, min(height, width) / 6)
    reflectance, labels = SURFACES[target](rng, height, width, scale)
    if clouds:
        sky = smooth_field(rng, height, width, scale * 0.8)
        opacity = np.clip((sky - np.quantile(sky, 0.94)) / 0.4, 0, 1)
        cloud = np.tile(SIGNATURES["cloud"], len(reflectance) // len(BANDS))  # every date of a crop scene
        reflectance = (1 - opacity) * reflectance + opacity * cloud[:, None, None]
        labels[opacity > 0.5] = NODATA_LABEL
    dn = np.clip(np.round(reflectance * 10000), 0, 32767).astype(np.int16)
    if nodata:
        missing = np.zeros((height, width), dtype=bool)
        for _ in range(2):  # two rectangular gaps
            h, w = max(1, height // 8), max(1, width // 10)
            y, x = rng.integers(0, max(1, height - h)), rng.integers(0, max(1, width - w))
            missing[y:y + h, x:x + w] = True
        yy, xx = np.mgrid[0:height, 0:width]
        missing |= xx + yy < min(height, width) // 6  # a swath edge in the top-left corner
        dn[:, missing] = NODATA_DN
        labels[missing] = NODATA_LABEL
    return dn, labels


def surface_reflectance(rng: np.random.Generator, kinds: np.ndarray, surfaces, scale: float) -> np.ndarray:
    """Reflectance [6, H, W] of each pixel's surface (`kinds` indexes `surfaces`), textured and noisy."""
    height, width = kinds.shape
    table = np.asarray([SIGNATURES[s] for s in surfaces]).T  # [band, surface]
    texture = 1 + 0.08 * smooth_field(rng, height, width, max(4.0, scale / 5))
    reflectance = table[:, kinds] * texture
    reflectance += rng.normal(0, 0.0025, reflectance.shape)
    return reflectance


def water_surfaces(rng: np.random.Generator, height: int, width: int, scale: float):
    """Flood scene: lakes and a meandering river among vegetation, urban and soil; labels land/water."""
    terrain = smooth_field(rng, height, width, scale) + 0.5 * smooth_field(rng, height, width, scale / 3)
    wet = smooth_field(rng, height, width, scale * 1.3) + 0.3 * smooth_field(rng, height, width, scale / 4)
    water = wet > np.quantile(wet, 0.88)
    # A meandering river across the scene.
    yy, xx = np.mgrid[0:height, 0:width]
    phase, centre = rng.uniform(0, 2 * np.pi), rng.uniform(0.3, 0.7) * height
    path = centre + 0.15 * height * np.sin(xx / max(width, 1) * 2 * np.pi * 1.5 + phase)
    water |= np.abs(yy - path) < max(1.5, height / 60)

    kinds = np.zeros((height, width), dtype=np.uint8)
    kinds[terrain > np.quantile(terrain, 0.55)] = 1
    kinds[terrain > np.quantile(terrain, 0.75)] = 2
    kinds[water] = 3
    reflectance = surface_reflectance(rng, kinds, ("vegetation", "urban", "soil", "water"), scale)
    return reflectance, np.where(water, WATER, LAND).astype(np.uint8)


def burn_surfaces(rng: np.random.Generator, height: int, width: int, scale: float):
    """Burn scene: vegetation with some soil, urban and a lake (the look-alikes: soil is bright in
    SWIR, water dark in NIR), and burn scars (smooth blobs, 4..20 % of the scene) whose severity
    mixes burn into vegetation from 0.55 at their edge to 1 inside; labels unburned/burn scar."""
    terrain = smooth_field(rng, height, width, scale) + 0.5 * smooth_field(rng, height, width, scale / 3)
    fire = smooth_field(rng, height, width, scale * 1.2) + 0.35 * smooth_field(rng, height, width, scale / 4)
    lake = smooth_field(rng, height, width, scale * 1.5)
    kinds = np.zeros((height, width), dtype=np.uint8)
    kinds[terrain > np.quantile(terrain, 0.80)] = 1
    kinds[terrain > np.quantile(terrain, 0.90)] = 2
    kinds[lake > np.quantile(lake, 0.96)] = 3
    reflectance = surface_reflectance(rng, kinds, ("vegetation", "urban", "soil", "water"), scale)
    edge = np.quantile(fire, 1 - rng.uniform(0.04, 0.20))
    scar = (fire > edge) & (kinds != 3)
    severity = np.where(scar, np.clip(0.55 + (fire - edge) * 1.5, 0, 1), 0.0)
    burn = np.asarray(SIGNATURES["burn"])[:, None, None] * (1 + 0.05 * rng.standard_normal((6, 1, 1)))
    reflectance = (1 - severity) * reflectance + severity * burn
    return reflectance, np.where(scar, BURN_SCAR, UNBURNED).astype(np.uint8)


# Crop scenes (target "crops"): three dates (spring, summer, autumn) of one place. Each class is a calendar:
# a greenness per date mixing vegetation into bare soil (g 1: full canopy, 0: bare), or a fixed surface.
# Corn and soybeans are identical on dates 1 and 2 and part only in autumn; winter wheat and sorghum
# swap spring and autumn; so a single date cannot tell them apart, only the change between dates.
CROP_DATES = ("2023-04-15", "2023-07-01", "2023-09-15")
CROP_CALENDARS = (  # in the dataset's class order (conf/model/geo/hls_crops.yaml)
    ("natural_vegetation", (0.45, 0.55, 0.45)),
    ("forest", (0.85, 0.95, 0.85)),
    ("corn", (0.05, 0.85, 0.30)),
    ("soybeans", (0.05, 0.85, 0.70)),
    ("wetlands", "wetland"),
    ("developed_barren", "urban"),
    ("open_water", "water"),
    ("winter_wheat", (0.80, 0.40, 0.05)),
    ("alfalfa", (0.70, 0.25, 0.70)),
    ("fallow_idle_cropland", (0.05, 0.10, 0.15)),
    ("cotton", (0.05, 0.35, 0.55)),
    ("sorghum", (0.05, 0.40, 0.80)),
    ("other", (0.25, 0.25, 0.25)),
)
CROP_SHARES = (0.10, 0.08, 0.11, 0.11, 0.04, 0.05, 0.04, 0.09, 0.08, 0.07, 0.08, 0.08, 0.07)  # of the fields


def crop_signature(calendar, date: int, rng: np.random.Generator) -> np.ndarray:
    """Reflectance [6] of one field on one date: its calendar's greenness (jittered per field) or surface."""
    if calendar == "wetland":
        return 0.5 * np.asarray(SIGNATURES["water"]) + 0.5 * np.asarray(SIGNATURES["vegetation"])
    if isinstance(calendar, str):
        return np.asarray(SIGNATURES[calendar])
    green = float(np.clip(calendar[date] + rng.normal(0, 0.05), 0, 1))
    return green * np.asarray(SIGNATURES["vegetation"]) + (1 - green) * np.asarray(SIGNATURES["soil"])


def crop_surfaces(rng: np.random.Generator, height: int, width: int, scale: float):
    """Crop scene: rectangular fields (12..48 px a side), each one class of CROP_CALENDARS, seen on three
    dates; reflectance [3 x 6, H, W] date-major (all bands of date 1, then date 2, then date 3)."""
    def cuts(length: int):
        edges = [0]
        while edges[-1] < length:
            edges.append(edges[-1] + int(rng.integers(12, 49)))
        return np.minimum(edges, length)

    rows, cols = cuts(height), cuts(width)
    labels = np.zeros((height, width), dtype=np.uint8)
    fields = []
    for y0, y1 in zip(rows[:-1], rows[1:]):
        for x0, x1 in zip(cols[:-1], cols[1:]):
            kind = int(rng.choice(len(CROP_CALENDARS), p=CROP_SHARES))
            labels[y0:y1, x0:x1] = kind
            fields.append((slice(y0, y1), slice(x0, x1), kind))
    dates = len(CROP_DATES)
    reflectance = np.empty((dates * len(BANDS), height, width))
    for field_rows, field_cols, kind in fields:
        calendar = CROP_CALENDARS[kind][1]
        for date in range(dates):
            band_rows = slice(date * len(BANDS), (date + 1) * len(BANDS))
            reflectance[band_rows, field_rows, field_cols] = crop_signature(calendar, date, rng)[:, None, None]
    for date in range(dates):  # texture and noise differ per date
        texture = 1 + 0.06 * smooth_field(rng, height, width, max(4.0, scale / 5))
        band_rows = slice(date * len(BANDS), (date + 1) * len(BANDS))
        reflectance[band_rows] *= texture
        reflectance[band_rows] += rng.normal(0, 0.0025, (len(BANDS), height, width))
    return reflectance, labels


SURFACES = {"water": water_surfaces, "burn_scar": burn_surfaces, "crops": crop_surfaces}


def write_scene(path, height: int = 300, width: int = 400, seed: int = 0, *, labels_path=None,
                crs: Optional[str] = "EPSG:32615", clouds: bool = True, nodata: bool = True,
                target: str = "water") -> Path:
    """Write the scene (and optionally its labels) as tiled, compressed GeoTIFFs; returns `path`."""
    import rasterio

    dn, labels = make_scene(height, width, seed, clouds=clouds, nodata=nodata, target=target)
    profile = _profile(height, width, crs)
    _write_bands(path, dn, profile)
    if labels_path is not None:
        with rasterio.open(labels_path, "w", count=1, dtype="uint8", nodata=NODATA_LABEL, **profile) as dst:
            dst.write(labels[None])
    return Path(path)


def _profile(height: int, width: int, crs: Optional[str]) -> dict:
    from affine import Affine

    grid = Affine(30.0, 0.0, 500000.0, 0.0, -30.0, 3300000.0)  # 30 m UTM pixels
    profile = dict(driver="GTiff", height=height, width=width, crs=crs, transform=grid,
                   compress="deflate", predictor=2, zlevel=9)
    if height >= 16 and width >= 16:
        profile.update(tiled=True, blockxsize=min(256, 16 * (width // 16)), blockysize=min(256, 16 * (height // 16)))
    return profile


def _write_bands(path, dn: np.ndarray, profile: dict, tags: Optional[dict] = None) -> None:
    """DN [C, H, W] (or dates x C, date-major: described `BLUE (date 1)`, ...) with band descriptions."""
    import rasterio

    dates = len(dn) // len(BANDS)
    with rasterio.open(path, "w", count=len(dn), dtype="int16", nodata=NODATA_DN, **profile) as dst:
        dst.write(dn)
        for band in range(len(dn)):
            name = BANDS[band % len(BANDS)]
            dst.set_band_description(band + 1, name if dates == 1 else f"{name} (date {band // len(BANDS) + 1})")
        if tags:
            dst.update_tags(**tags)


def write_crop_dates(paths, height: int = 192, width: int = 256, seed: int = 0, *, stacked_path=None,
                     labels_path=None, crs: Optional[str] = "EPSG:32615", dates=CROP_DATES) -> list:
    """A crop scene as one 6-band GeoTIFF per date (`paths`, each tagged ACQUISITION_DATE = `dates`[i]),
    optionally also as one stacked 18-band file (date-major) and its labels; returns the paths written."""
    import rasterio

    dn, labels = make_scene(height, width, seed, target="crops")
    profile = _profile(height, width, crs)
    written = []
    for date, (path, when) in enumerate(zip(paths, dates)):
        _write_bands(path, dn[date * len(BANDS):(date + 1) * len(BANDS)], profile, {"ACQUISITION_DATE": when})
        written.append(Path(path))
    if stacked_path is not None:
        _write_bands(stacked_path, dn, profile)
        written.append(Path(stacked_path))
    if labels_path is not None:
        with rasterio.open(labels_path, "w", count=1, dtype="uint8", nodata=NODATA_LABEL, **profile) as dst:
            dst.write(labels[None])
        written.append(Path(labels_path))
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", help="scene GeoTIFF to write")
    parser.add_argument("--target", choices=sorted(SURFACES), default="water",
                        help="what the labels mark (default water: flood scenes)")
    parser.add_argument("--height", type=int, default=300)
    parser.add_argument("--width", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labels", help="also write the label raster here")
    parser.add_argument("--no-clouds", action="store_true")
    parser.add_argument("--no-nodata", action="store_true")
    parser.add_argument("--sample", action="store_true",
                        help="write the packaged samples (" + ", ".join(p.name for p in SAMPLES.values()) + ")")
    args = parser.parse_args(argv)
    if args.sample:
        SAMPLES_DIR.mkdir(parents=True, exist_ok=True)
        for target, sample in SAMPLES.items():
            labels = sample.with_name(sample.stem + "_labels.tif")
            write_scene(sample, 300, 400, seed=0, labels_path=labels, target=target)
            print(f"wrote {sample} ({sample.stat().st_size} bytes) and {labels}")
        dates = [SAMPLES_DIR / f"crops_sample_date{i}.tif" for i in range(1, len(CROP_DATES) + 1)]
        for path in write_crop_dates(dates, *CROPS_SAMPLE_SIZE, seed=0, stacked_path=CROPS_SAMPLE,
                                     labels_path=SAMPLES_DIR / "crops_sample_labels.tif"):
            print(f"wrote {path} ({path.stat().st_size} bytes)")
        return
    if not args.output:
        parser.error("give an output path or --sample")
    write_scene(args.output, args.height, args.width, args.seed, labels_path=args.labels,
                clouds=not args.no_clouds, nodata=not args.no_nodata, target=args.target)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
