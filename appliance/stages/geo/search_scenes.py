"""A search's scenes for `raster_inputs` (`found_scenes`: search, then plan) and what `appliance check`
prints about them (`search_listing`: a line per item found, run or skipped and why, then the totals)."""
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from appliance.errors import InputError
from appliance.stages.geo.multidate import dates_spec
from appliance.stages.geo.scene_sources import SceneSpec
from appliance.stages.geo.search_plan import Skipped, item_id, plan_scenes, self_href, tile_of, when
from appliance.stages.geo.stac_in import item_spec
from appliance.stages.geo.stac_search import check_search, describe, run_search


@dataclass(frozen=True)
class FoundScenes:
    scenes: List[List[dict]]  # each the items of one scene, date after date
    skipped: List[Skipped]
    found: int  # items the API answered


def check_one_source(input: Any) -> None:
    """A run takes its scenes from `input` or from a search, never both."""
    if input not in (None, "", []):
        raise InputError("input: give either input= or search.url, not both", param="input")


def found_scenes(search: Any, aoi, stac_bands: Optional[Sequence[str]], frames: int) -> FoundScenes:
    """Search and plan; InputError naming `search` when nothing is left to map."""
    if not stac_bands:
        raise InputError("search: the model declares no STAC band names (model.geo.stac_bands), so a search's items "
                         "cannot be read", param="search")
    items = run_search(search, aoi)
    scenes, skipped = plan_scenes(items, stac_bands, frames)
    if not items or not scenes:
        why = "no items found" if not items else f"none of the {len(items)} items found can be mapped"
        raise InputError(f"search: {why} ({describe(search, check_search(search, aoi)['bbox'])}); widen "
                         "search.bbox, search.datetime or search.max_cloud_cover", param="search")
    return FoundScenes(scenes, skipped, len(items))


def scene_spec_of(scene: Sequence[dict], stac_bands: Sequence[str], model_bands: Sequence[str]) -> SceneSpec:
    """One scene's SceneSpec: the item's (one date) or its dates' (several), read asset by asset."""
    specs = [item_spec(self_href(item), item, stac_bands, model_bands) for item in scene]
    return specs[0] if len(specs) == 1 else dates_spec(specs)


def search_listing(cfg: Any) -> List[str]:
    """`appliance check`'s lines for a search (none without `search.url`): each item found, then totals."""
    search = cfg.get("search")
    if search is None or not search.get("url"):
        return []
    from appliance.stages.geo.aoi import parse_aoi
    from appliance.stages.geo.multidate import model_frames

    check_one_source(cfg.get("input"))
    geo = cfg.model.get("geo")
    stac_bands = list(geo.stac_bands) if geo is not None and geo.get("stac_bands") else None
    aoi = parse_aoi(cfg.get("aoi"), cfg.get("aoi_crs"))
    found = found_scenes(search, aoi, stac_bands, model_frames(cfg))
    lines = []
    for number, scene in enumerate(found.scenes, 1):
        for item in scene:
            lines.append(f"run  {item_id(item)}: scene {number}, tile {tile_of(item)}, {when(item):%Y-%m-%d}, "
                         f"{_cloud(item)}, {_pixels_text(item)}")
    if search.get("max_cloud_cover") is not None:
        kept = {item_id(item) for scene in found.scenes for item in scene} | {s.item_id for s in found.skipped}
        limit = float(search.get("max_cloud_cover"))
        for item in run_search(search, aoi, cloud_filter=False):
            if item_id(item) not in kept:
                lines.append(f"skip {item_id(item)}: {_cloud(item)} > {limit:g}% (search.max_cloud_cover)")
    lines.extend(f"skip {s.item_id}: {s.reason}" for s in found.skipped)
    pixels = [_pixels(scene[0]) for scene in found.scenes]
    known = [count for count in pixels if count is not None]
    total = f"{sum(known):,} pixels" if len(known) == len(pixels) else "pixels unknown (items without proj:shape)"
    tiles = len({tile_of(scene[0]) for scene in found.scenes})
    lines.append(f"search: {found.found} items found, {len(found.scenes)} scenes over {tiles} tiles would run "
                 f"({total}), {len(lines) - sum(map(len, found.scenes))} items skipped")
    return lines


def _cloud(item: dict) -> str:
    cloud = (item.get("properties") or {}).get("eo:cloud_cover")
    return "cloud unknown" if cloud is None else f"cloud {float(cloud):g}%"


def _pixels(item: dict) -> Optional[int]:
    """Pixels of the item's grid (`proj:shape`: the item's, else its first asset's that declares one)."""
    shapes = [(item.get("properties") or {}).get("proj:shape")]
    shapes += [asset.get("proj:shape") for asset in (item.get("assets") or {}).values() if isinstance(asset, dict)]
    shape = next((s for s in shapes if s), None)
    return int(shape[0]) * int(shape[1]) if shape else None


def _pixels_text(item: dict) -> str:
    pixels = _pixels(item)
    return f"{pixels:,} px" if pixels is not None else "pixels unknown"
