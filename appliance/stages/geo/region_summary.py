"""`summary.json` and its table: per item and for the region, each class's area in km², the valid share
and the nodata share.

Per item the counts are scene_report.class_summary's (full resolution, strip by strip; areas from the
pixel size in a projected CRS, per row on the sphere in a geographic one). The region's line is the
mosaic's when one was made (overlaps counted once, by the mosaic's rule), else the sum of the items'.
"""
import json
import os
from typing import Any, Dict, List, Optional, Sequence

from appliance.output_files import AtomicFile
from appliance.stages.geo.geotiff import open_raster
from appliance.stages.geo.region_items import RegionItem
from appliance.stages.geo.scene_report import class_summary, tagged_class_names

SUMMARY_FILE = "summary.json"


def raster_summary(path: str) -> Dict[str, Any]:
    """A class mask's areas and shares: {classes: [{name, pixels, area_km2}], valid_share, nodata_share}."""
    with open_raster(path) as ds:
        counted = class_summary(ds, tagged_class_names(ds))
    return _shares(counted["classes"], counted["valid_pixels"], counted["nodata_pixels"])


def _shares(classes: List[Dict[str, Any]], valid: int, nodata: int) -> Dict[str, Any]:
    total = valid + nodata
    return {"classes": [{k: c[k] for k in ("name", "pixels", "area_km2")} for c in classes],
            "valid_pixels": valid, "nodata_pixels": nodata,
            "valid_share": valid / total if total else 0.0, "nodata_share": nodata / total if total else 0.0}


def region_summary(items: Sequence[RegionItem], mosaic: Optional[str]) -> Dict[str, Any]:
    per_item = [{"id": r.id, "mask": os.path.basename(r.mask_path), **raster_summary(r.mask_path)} for r in items]
    if mosaic is not None:
        total = {"source": os.path.basename(mosaic), **raster_summary(mosaic)}
    else:
        total = {"source": "sum of the items", **_summed(per_item)}
    return {"items": per_item, "total": total}


def _summed(per_item: List[Dict[str, Any]]) -> Dict[str, Any]:
    if not per_item:
        return _shares([], 0, 0)
    classes = [{"name": c["name"], "pixels": sum(s["classes"][i]["pixels"] for s in per_item),
                "area_km2": (None if any(s["classes"][i]["area_km2"] is None for s in per_item)
                             else sum(s["classes"][i]["area_km2"] for s in per_item))}
               for i, c in enumerate(per_item[0]["classes"])]
    return _shares(classes, sum(s["valid_pixels"] for s in per_item), sum(s["nodata_pixels"] for s in per_item))


def write_summary(directory: str, summary: Dict[str, Any]) -> str:
    path = os.path.join(directory, SUMMARY_FILE)
    with AtomicFile(path) as temp, open(temp, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return path


def summary_table(summary: Dict[str, Any]) -> str:
    """One line per item and one for the region: each class's km², then the valid and nodata shares."""
    rows = [*summary["items"], {"id": f"region ({summary['total']['source']})", **summary["total"]}]
    names = [c["name"] for c in rows[0]["classes"]] if rows[0]["classes"] else []
    header = ["item", *(f"{n} km²" for n in names), "valid", "nodata"]
    body = [[row["id"], *(_km2(c["area_km2"]) for c in row["classes"]),
             f"{row['valid_share']:.1%}", f"{row['nodata_share']:.1%}"] for row in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
             for line in [header, *body]]
    return "\n".join(lines)


def _km2(area: Optional[float]) -> str:
    return "-" if area is None else f"{area:.3f}"
