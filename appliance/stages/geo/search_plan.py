"""From the items a search found to the scenes a run maps (pure: item dicts in, plans out).

`item_problem`: why an item cannot be a scene for the model (a band missing among its assets; its bands
declared on different CRSs), or None. `plan_scenes`: the scenes, each a list of items in time order:
  - a one-date model (T = 1): one item a scene, in the API's order;
  - a T-date model: T items of one tile (`tile_of`: the MGRS tile of `grid:code`, the `mgrs:*` fields or an
    HLS id, else the item's own id). A tile's n items, sorted by time, give floor(n / T) scenes: the window
    of T consecutive dates spanning the fewest days is taken first (nearest dates first; ties: the earliest),
    then the next among the dates left, and so on; the dates no window took are skipped. Scenes are listed
    by tile (first seen), then by their first date.
Skipped items come back with their reason; a run logs them, `appliance check` lists them.
"""
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from appliance.errors import InputError
from appliance.stages.geo.acquisition import parse_when
from appliance.stages.geo.stac_in import pick_assets

HLS_TILE = re.compile(r"\.T(\d{2}[A-Z]{3})\.")


@dataclass(frozen=True)
class Skipped:
    item_id: str
    reason: str


def item_id(item: dict) -> str:
    return str(item.get("id") or "(no id)")


def self_href(item: dict) -> str:
    """Where the item lives (its `self` link): the scene's name, and what the mask derives from."""
    link = next((link for link in item.get("links") or [] if link.get("rel") == "self"), None)
    if link is None:
        raise InputError(f"search.url: the API's item {item_id(item)} has no self link", param="search.url")
    return str(link["href"])


def tile_of(item: dict) -> str:
    properties = item.get("properties") or {}
    code = str(properties.get("grid:code") or "")
    if code.upper().startswith("MGRS-"):
        return code[5:]
    if properties.get("mgrs:utm_zone") is not None and properties.get("mgrs:grid_square"):
        return (f"{int(properties['mgrs:utm_zone']):02d}{properties.get('mgrs:latitude_band', '')}"
                f"{properties['mgrs:grid_square']}")
    match = HLS_TILE.search(item_id(item))
    return match.group(1) if match else item_id(item)


def when(item: dict):
    properties = item.get("properties") or {}
    return parse_when(str(properties.get("datetime") or properties.get("start_datetime") or ""))


def item_crs(asset: dict, item: dict) -> Optional[str]:
    """The CRS an asset declares (projection extension), else the item's."""
    for where in (asset, item.get("properties") or {}):
        for key in ("proj:code", "proj:epsg"):
            if where.get(key) is not None:
                value = where[key]
                return f"EPSG:{value}" if key == "proj:epsg" else str(value)
    return None


def item_problem(item: dict, stac_bands: Sequence[str]) -> Optional[str]:
    try:
        keys = pick_assets(item.get("assets") or {}, stac_bands)
    except InputError as e:
        return str(e)
    crs = {key: item_crs(item["assets"][key], item) for key in keys}
    if len({c for c in crs.values() if c is not None}) > 1:
        return "its bands are on different CRSs (" + ", ".join(f"{k} {c}" for k, c in crs.items()) + ")"
    if when(item) is None:
        return "it has no datetime"
    return None


def plan_scenes(items: Sequence[dict], stac_bands: Sequence[str],
                frames: int) -> Tuple[List[List[dict]], List[Skipped]]:
    """(scenes, skipped) by the rules in the module docstring."""
    usable, skipped = [], []
    for item in items:
        problem = item_problem(item, stac_bands)
        if problem:
            skipped.append(Skipped(item_id(item), problem))
        else:
            usable.append(item)
    if frames == 1:
        return [[item] for item in usable], skipped
    tiles: Dict[str, List[dict]] = {}
    for item in usable:
        tiles.setdefault(tile_of(item), []).append(item)
    scenes: List[List[dict]] = []
    for tile, tile_items in tiles.items():
        ordered = sorted(tile_items, key=when)
        chosen = nearest_windows([when(item) for item in ordered], frames)
        scenes.extend([ordered[i] for i in window] for window in chosen)
        taken = {i for window in chosen for i in window}
        skipped.extend(Skipped(item_id(item), f"tile {tile}: no {frames} dates left to group it with "
                               f"({len(ordered)} dates found, {len(chosen)} scene(s) of {frames} made)")
                       for i, item in enumerate(ordered) if i not in taken)
    return scenes, skipped


def nearest_windows(times: Sequence, frames: int) -> List[List[int]]:
    """Indexes of `times` (sorted) grouped T at a time: the window of T consecutive free dates spanning the
    least time first, ties to the earliest; windows returned by their first date."""
    free = list(range(len(times)))
    windows = []
    while len(free) >= frames:
        starts = range(len(free) - frames + 1)
        best = min(starts, key=lambda s: (times[free[s + frames - 1]] - times[free[s]], s))
        windows.append(free[best:best + frames])
        del free[best:best + frames]
    return sorted(windows)
