"""`collection.json`: a STAC Collection over a region's items (region_items.py), linking each and linked
back from each.

Its extent is what was mapped: the union of the items' lon/lat bboxes and the span of their datetimes.
Its `summaries` carry the classes (the `classification` extension's `classification:classes`, the first
item's mask classes: one model made them all). Item hrefs are relative to the directory, so the
directory can be moved or served as it is.
"""
import json
import os
from typing import List, Sequence

import pystac
from pystac.extensions.classification import ClassificationExtension

from appliance.output_files import AtomicFile
from appliance.stages.geo.region_items import RegionItem

COLLECTION_FILE = "collection.json"


def region_collection(items: Sequence[RegionItem], collection_id: str, description: str) -> pystac.Collection:
    """The collection over `items` (one at least); masks without a CRS have no bbox: the whole world."""
    bboxes = [r.item["bbox"] for r in items if r.item.get("bbox")]
    spatial = [[min(b[0] for b in bboxes), min(b[1] for b in bboxes), max(b[2] for b in bboxes),
                max(b[3] for b in bboxes)]] if bboxes else [[-180.0, -90.0, 180.0, 90.0]]
    times = [r.datetime for r in items]
    extent = pystac.Extent(pystac.SpatialExtent(spatial), pystac.TemporalExtent([[min(times), max(times)]]))
    collection = pystac.Collection(id=collection_id, description=description, extent=extent, license="other")
    classes = items[0].item["assets"]["mask"].get("classification:classes")
    if classes:
        ClassificationExtension.add_to(collection)
        collection.summaries.add("classification:classes", classes)
    for r in items:
        collection.add_link(pystac.Link(pystac.RelType.ITEM, os.path.basename(r.item_path),
                                        media_type=pystac.MediaType.GEOJSON, title=r.id))
    return collection


def write_collection(directory: str, items: List[RegionItem], collection_id: str, description: str) -> str:
    """Write `collection.json` in `directory` and point each item at it (`collection`, `parent` links and
    the `collection` field); returns the collection's path."""
    collection = region_collection(items, collection_id, description)
    path = os.path.join(directory, COLLECTION_FILE)
    _write_json(collection.to_dict(include_self_link=False, transform_hrefs=False), path)
    for r in items:
        item = dict(r.item, collection=collection_id)
        links = [link for link in item.get("links", []) if link.get("rel") not in ("collection", "parent")]
        back = {"href": COLLECTION_FILE, "type": pystac.MediaType.JSON}
        item["links"] = links + [{"rel": "collection", **back}, {"rel": "parent", **back}]
        if item != r.item:  # a rerun leaves linked items as they are
            _write_json(item, r.item_path)
    return path


def _write_json(data: dict, path: str) -> None:
    with AtomicFile(path) as temp, open(temp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
