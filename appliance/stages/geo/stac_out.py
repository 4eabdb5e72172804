"""A STAC item beside each mask (`<mask stem>.stac.json`): where it lies, what its classes mean, what
it was made from and by what.

Projection extension: the mask's CRS (EPSG code, else WKT2), shape, transform and bbox in that CRS.
Classification extension on the mask asset: each class's value, name and colour, and 255 as nodata.
A probabilities file written beside a class map is a second asset, `probabilities`, role `data` like the
mask (STAC's role for the data itself; the key and title say which is which), one band per class.
Links: `derived_from` each source (the STAC item, or the GeoTIFF / per-band files): URLs as they are,
local files relative to the item's own directory (STAC resolves a relative href against the item, not
the directory a run started in), absolute where no relative path exists (another drive). The item's
geometry and bbox are the mask's footprint in lon/lat (none without a CRS). `datetime` is the
acquisition time when known (given with date=, the STAC item's, the file's date tags or HLS name:
acquisition.py), else the time the mask was made, which is also `created`. A model with time and
location encodings records what it was given in `appliance:model_coords`.
"""
import datetime as dt
import json
import os
from typing import List, Optional, Sequence, Tuple

import pystac
from pystac.extensions.classification import Classification, ClassificationExtension
from pystac.extensions.projection import ProjectionExtension
from rasterio.transform import array_bounds
from rasterio.warp import transform_bounds

from appliance.output_files import AtomicFile, sibling_path
from appliance.stages.geo.acquisition import coords_properties
from appliance.stages.geo.scene_sources import is_remote
from appliance.stages.geo.stitch import NODATA_CLASS

STAC_SUFFIX = ".stac.json"


def stac_path(output_path: str) -> str:
    return sibling_path(output_path, STAC_SUFFIX)


def _footprint(scene):
    """(geometry, bbox) in lon/lat, or (None, None) when the scene has no CRS."""
    if scene.crs is None:
        return None, None
    west, south, east, north = transform_bounds(scene.crs, "EPSG:4326", *_native_bbox(scene), densify_pts=21)
    ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
    return {"type": "Polygon", "coordinates": [ring]}, [west, south, east, north]


def _when(value: Optional[str]) -> Optional[dt.datetime]:
    if not value:
        return None
    for parse in (lambda v: dt.datetime.fromisoformat(v.replace("Z", "+00:00")),
                  lambda v: dt.datetime.strptime(v, "%Y:%m:%d %H:%M:%S")):  # TIFFTAG_DATETIME
        try:
            when = parse(value)
            return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
        except ValueError:
            continue
    return None


def mask_item(scene, output_path: str, class_names: List[str], class_colours: Sequence[Tuple[int, int, int]],
              classes: bool, model: str, pipeline: str, quicklook: Optional[str] = None,
              probabilities: Optional[str] = None) -> pystac.Item:
    """The STAC item describing the mask at `output_path` (asset hrefs relative to the item's directory);
    a class mask's classes carry `class_colours` as their colour hints. `probabilities`: the path of the
    per-class probabilities written beside the class map (in the same directory), a second asset."""
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    geometry, bbox = _footprint(scene)
    stem = os.path.basename(output_path)
    stem = stem[: -len(".tif")] if stem.lower().endswith(".tif") else stem
    item = pystac.Item(
        id=stem, geometry=geometry, bbox=bbox, datetime=_when(scene.datetime) or now,
        properties={"created": now.isoformat(), "appliance:model": model, "appliance:pipeline": pipeline,
                    "appliance:source": scene.name, **coords_properties(scene)},
    )
    asset = pystac.Asset(os.path.basename(output_path), media_type=pystac.MediaType.COG, roles=["data"],
                         title="classes" if classes else "class probabilities")
    item.add_asset("mask", asset)
    if probabilities:
        bands = ", ".join(f"p({name})" for name in class_names)
        item.add_asset("probabilities", pystac.Asset(
            os.path.basename(probabilities), media_type=pystac.MediaType.COG, roles=["data"],
            title="class probabilities", description=f"float32, one band per class ({bands}), nodata NaN"))
    if quicklook:
        item.add_asset("quicklook", pystac.Asset(os.path.basename(quicklook), media_type=pystac.MediaType.PNG,
                                                 roles=["overview"]))
    projection = ProjectionExtension.ext(item, add_if_missing=True)
    epsg = scene.crs.to_epsg() if scene.crs is not None else None
    projection.apply(
        epsg=epsg, wkt2=scene.crs.to_wkt() if scene.crs is not None and epsg is None else None,
        shape=[scene.height, scene.width], transform=list(scene.transform)[:6],
        bbox=_native_bbox(scene) if scene.crs is not None else None,
    )
    if classes:
        found = [Classification.create(value=i, name=_name(n), description=n,
                                       color_hint="%02X%02X%02X" % tuple(colour))
                 for i, (n, colour) in enumerate(zip(class_names, class_colours))]
        found.append(Classification.create(value=NODATA_CLASS, name="nodata", nodata=True))
        ClassificationExtension.ext(asset, add_if_missing=True).apply(classes=found)
    item_dir = os.path.dirname(os.path.abspath(stac_path(output_path)))
    for href in scene.links:
        item.add_link(pystac.Link(pystac.RelType.DERIVED_FROM, _from_item(href, item_dir), media_type=_media(href)))
    return item


def _from_item(href: str, item_dir: str) -> str:
    if is_remote(href):
        return href
    full = os.path.abspath(href)
    try:
        return os.path.relpath(full, item_dir)
    except ValueError:  # Windows: another drive
        return full


def _native_bbox(scene) -> List[float]:
    return list(array_bounds(scene.height, scene.width, scene.transform))


def _name(text: str) -> str:
    """classification:classes names are identifiers (^[0-9A-Za-z-_]+$)."""
    cleaned = "".join(c if c.isalnum() or c in "-_" else "_" for c in text)
    return cleaned or "class"


def _media(href: str) -> str:
    return pystac.MediaType.JSON if href.lower().split("?")[0].endswith(".json") else pystac.MediaType.GEOTIFF


def write_item(item: pystac.Item, path: str) -> None:
    """Write the item as JSON, atomically; relative asset hrefs stay relative."""
    data = item.to_dict(include_self_link=False, transform_hrefs=False)
    with AtomicFile(path) as temp, open(temp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
