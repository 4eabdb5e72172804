"""Synthetic HLS-like STAC items for the STAC API tests: tiles x dates of small scenes, each item's six
bands written as COGs (served by tests.geo.hls.RangeServer) and described as HLS catalogs do
(`eo:cloud_cover`, `grid:code` MGRS-<tile>, `proj:code`, `proj:shape`, per-band `eo:bands` assets)."""
import datetime as dt
import json
from pathlib import Path
from typing import Dict, List

import rasterio
from affine import Affine
from rasterio.warp import transform_bounds

from tests.geo.conftest import synthetic
from tests.geo.hls import HLS_BANDS, split_bands, stac_item

COLLECTION = "hls-s30"
TILES = ("15RYP", "15RYQ", "15RXP")
FIRST_DATE = dt.date(2024, 4, 1)
DATE_STEP_DAYS = 10
# Per date (the same for every tile): three of the nine dates are cloudier than 50 %.
CLOUD_COVER = (5, 12, 85, 20, 3, 60, 8, 15, 95)
SIZE = 64  # pixels a side: small scenes keep a run over many items fast
CRS = "EPSG:32615"


def item_id(tile: str, day: dt.date) -> str:
    return f"HLS.S30.T{tile}.{day.year}{day.timetuple().tm_yday:03d}T165849.v2.0"


def tile_transform(tile_index: int) -> Affine:
    """Tiles side by side, about 100 km apart in one UTM zone, on one 30 m pixel grid (as the HLS tiles of a
    zone are: their corners fall on multiples of 60 m, e.g. 399960, 499980): 99,990 m is 3,333 pixels."""
    return Affine(30.0, 0.0, 500000.0 + 99990.0 * tile_index, 0.0, -30.0, 3300000.0)


def write_catalog(root: Path, base_url: str) -> List[dict]:
    """Scenes and items under `root`, asset hrefs under `base_url`; the items, tile after tile, in date order."""
    items = []
    for t, tile in enumerate(TILES):
        for d, cloud in enumerate(CLOUD_COVER):
            day = FIRST_DATE + dt.timedelta(days=DATE_STEP_DAYS * d)
            items.append(write_item(root, base_url, tile, day, cloud, tile_transform(t), seed=100 * t + d))
    return items


def write_item(root: Path, base_url: str, tile: str, day: dt.date, cloud: float, transform: Affine,
               seed: int, bands=HLS_BANDS, size: int = SIZE) -> dict:
    name = item_id(tile, day)
    scene = root / f"{name}.scene.tif"
    synthetic.write_scene(scene, size, size, seed=seed, crs=CRS)
    with rasterio.open(scene, "r+") as ds:
        ds.transform = transform
    files = split_bands(scene, root / name, prefix=name)
    scene.unlink()
    item = stac_item_dict(root / f"{name}.json", [f"{base_url}/{name}/{f.name}" for f in files], bands)
    lon_lat = transform_bounds(CRS, "EPSG:4326", transform.c, transform.f - 30.0 * size,
                               transform.c + 30.0 * size, transform.f)
    west, south, east, north = lon_lat
    item.update(
        id=name, collection=COLLECTION, bbox=list(lon_lat),
        geometry={"type": "Polygon", "coordinates": [[[west, south], [east, south], [east, north], [west, north],
                                                      [west, south]]]},
    )
    item["properties"] = {
        "datetime": f"{day.isoformat()}T16:58:49Z", "eo:cloud_cover": cloud, "grid:code": f"MGRS-{tile}",
        "proj:code": CRS, "proj:shape": [size, size], "proj:transform": list(transform)[:6], "platform": "sentinel-2b",
    }
    (root / f"{name}.json").write_text(json.dumps(item))  # the same item, to run alone (input=)
    return item


def stac_item_dict(path: Path, hrefs: List[str], bands) -> dict:
    stac_item(path, hrefs, bands=bands)
    item = json.loads(path.read_text())
    del item["assets"]["Fmask"]  # not served: a search result's item names only files that exist
    return item


def collection(items: List[dict]) -> Dict:
    bboxes = [item["bbox"] for item in items]
    times = sorted(item["properties"]["datetime"] for item in items)
    return {
        "type": "Collection", "stac_version": "1.0.0", "id": COLLECTION, "license": "proprietary",
        "description": "Synthetic HLS-like scenes for the tests", "links": [],
        "extent": {"spatial": {"bbox": [[min(b[0] for b in bboxes), min(b[1] for b in bboxes),
                                         max(b[2] for b in bboxes), max(b[3] for b in bboxes)]]},
                   "temporal": {"interval": [[times[0], times[-1]]]}},
    }
