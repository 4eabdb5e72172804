"""A region's items: the masks in an output directory whose outputs are complete, checked rather than assumed.

A mask's outputs are complete when its STAC item (`<mask stem>.stac.json`) reads, names the mask as its
`mask` asset, and the mask opens as a COG of the item's `proj:shape`. The mask is renamed into place
whole (output_files.AtomicFile) and its item is written after it, so a run stopped between the two
leaves a mask without an item: incomplete, made again by the next run.
"""
import datetime as dt
import glob
import json
import os
from dataclasses import dataclass
from typing import List, Optional

import rasterio
from rasterio.errors import RasterioError

from appliance.stages.geo.stac_out import STAC_SUFFIX, stac_path


@dataclass(frozen=True)
class RegionItem:
    mask_path: str
    item_path: str
    item: dict  # the STAC item as written beside the mask

    @property
    def id(self) -> str:
        return self.item["id"]

    @property
    def datetime(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.item["properties"]["datetime"].replace("Z", "+00:00"))


def incomplete(mask_path: str) -> Optional[str]:
    """Why the outputs of `mask_path` are not complete, or None when they are."""
    item_path = stac_path(mask_path)
    if not os.path.exists(mask_path):
        return "no mask"
    try:
        with open(item_path) as f:
            item = json.load(f)
        href = item["assets"]["mask"]["href"]
        shape = item["properties"].get("proj:shape")
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable STAC item {os.path.basename(item_path)}"
    if href != os.path.basename(mask_path):
        return f"its STAC item names {href} as the mask"
    try:
        with rasterio.open(mask_path) as ds:
            layout, size = ds.tags(ns="IMAGE_STRUCTURE").get("LAYOUT"), [ds.height, ds.width]
    except RasterioError as e:
        return f"the mask does not open ({e})"
    if layout != "COG":
        return "the mask is not a COG"
    if size != shape:
        return f"the mask is {size[1]}x{size[0]}, its STAC item says {shape[1]}x{shape[0]}"
    return None


def region_items(directory: str) -> List[RegionItem]:
    """The class masks in `directory` whose outputs are complete, oldest first (then by id)."""
    found = []
    for item_path in glob.glob(os.path.join(glob.escape(directory), "*" + STAC_SUFFIX)):
        with open(item_path) as f:
            item = json.load(f)
        asset = item.get("assets", {}).get("mask", {})
        mask_path = os.path.join(directory, asset.get("href", ""))
        if "classification:classes" in asset and incomplete(mask_path) is None:
            found.append(RegionItem(mask_path, item_path, item))
    return sorted(found, key=lambda r: (r.datetime, r.id))
