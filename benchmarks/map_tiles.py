"""A done scene's map tiles (appliance/stages/geo/map_tiles.py): time per tile and peak memory serving tiles
of a 10980 x 10980 mask (a Sentinel-2 tile's 10 m grid) against a 1098 x 1098 one. Memory should be flat in
the scene's size: rio-tiler reads a tile's window only, through the overviews that fit its zoom.

    .venv/bin/python benchmarks/map_tiles.py --tiles 48

Each mask is written by windows into a temporary directory as the pipeline writes one (tiled, deflate,
internal overviews, class tags); each size's tiles are then served in a fresh process, so its peak RSS
(resource.getrusage) is its own: half the tiles at the TileJSON's maxzoom spread over the scene (full
resolution), half at the zooms below down to minzoom (read from the overviews).
"""
import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.windows import Window

SIZES = (1098, 10980)
STRIP = 512  # rows written at a time


def write_mask(path: str, size: int) -> None:
    """Classes 0/1 in blocks of 37 pixels, 255 (no data) in one corner; 10 m UTM pixels."""
    profile = {"driver": "GTiff", "height": size, "width": size, "count": 1, "dtype": "uint8", "nodata": 255,
               "crs": "EPSG:32615", "transform": rasterio.Affine(10, 0, 500000, 0, -10, 3300000), "tiled": True,
               "blockxsize": 512, "blockysize": 512, "compress": "deflate"}
    with rasterio.open(path, "w", **profile) as dst:
        for row in range(0, size, STRIP):
            rows = min(STRIP, size - row)
            r, c = np.indices((rows, size))
            block = (((r + row) // 37 + c // 37) % 2).astype("uint8")
            block[(r + row < size // 10) & (c < size // 10)] = 255
            dst.write(block[None], window=Window(0, row, size, rows))
        dst.build_overviews([2 ** i for i in range(1, 12) if size // 2 ** i >= 256], Resampling.nearest)
        dst.update_tags(class_names="land,water", class_colours="#C8C8C8,#005AFF")


def serve_tiles(path: str, count: int) -> None:
    """In this process: `count` tiles of the mask; prints ms per tile, RSS before and peak, in MB."""
    from appliance.stages.geo.map_tiles import WEB_MERCATOR, mask_tile, tile_grid

    before = peak_rss_mb()
    grid = tile_grid(path)
    west, south, east, north = grid.bounds
    picks = random.Random(0)
    below = [picks.randint(grid.minzoom, grid.maxzoom - 1) for _ in range(count - count // 2)]
    zooms = [grid.maxzoom] * (count // 2) + below
    times = []
    for zoom in zooms:
        tile = WEB_MERCATOR.tile(picks.uniform(west, east), picks.uniform(south, north), zoom)
        start = time.perf_counter()
        png = mask_tile(path, tile.z, tile.x, tile.y)
        times.append((time.perf_counter() - start) * 1000)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"{statistics.median(times):.1f} {before:.0f} {peak_rss_mb():.0f} {grid.minzoom} {grid.maxzoom}")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=int, default=48, help="tiles served per scene (default 48)")
    parser.add_argument("--serve", nargs=2, metavar=("PATH", "COUNT"), help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.serve:
        serve_tiles(args.serve[0], int(args.serve[1]))
        return
    print(f"{'scene':>13} {'file MB':>8} {'zooms':>6} {'tiles':>6} {'ms/tile':>8} {'RSS before MB':>14} "
          f"{'peak RSS MB':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            path = os.path.join(tmp, f"mask_{size}.tif")
            write_mask(path, size)
            done = subprocess.run([sys.executable, __file__, "--serve", path, str(args.tiles)], capture_output=True,
                                  text=True, check=True)
            ms, before, peak, minzoom, maxzoom = done.stdout.split()
            print(f"{size:>6}x{size:<6} {os.path.getsize(path) / 2 ** 20:>8.1f} {minzoom + '-' + maxzoom:>6} "
                  f"{args.tiles:>6} {float(ms):>8.1f} {float(before):>14.0f} {float(peak):>12.0f}")


if __name__ == "__main__":
    main()
