"""A STAC item as a scene: the model's bands picked from the item's assets by band name.

The model declares its bands' STAC names (`model.geo.stac_bands`, e.g. HLS: blue, green, red, nir08,
swir16, swir22). An asset serves a band when one of its bands (`eo:bands`, or STAC 1.1's `bands`)
has that `common_name` / `eo:common_name` or `name`, or when the asset's key is that name (case and
punctuation ignored). Asset hrefs are taken relative to the item's own location.
"""
import json
import re
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence

from appliance.errors import ConfigError, InputError
from appliance.stages.geo.scene_sources import SceneSpec, is_remote, resolve_href, scheme, shown

MAX_ITEM_BYTES = 16 << 20


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def asset_band_names(key: str, asset: dict) -> List[str]:
    """Normalised names the asset answers to: its key, then each band's common name and name."""
    names = [_norm(key)]
    for band in list(asset.get("eo:bands") or []) + list(asset.get("bands") or []):
        if isinstance(band, dict):
            for field in ("common_name", "eo:common_name", "name"):
                if band.get(field):
                    names.append(_norm(band[field]))
    return names


def _describe(key: str, asset: dict) -> str:
    extra = [n for n in asset_band_names(key, asset)[1:] if n != _norm(key)]
    return f"{key} ({', '.join(dict.fromkeys(extra))})" if extra else key


def pick_assets(assets: Dict[str, dict], stac_bands: Sequence[str]) -> List[str]:
    """Asset keys serving each of `stac_bands`, in order. InputError naming the missing band(s)."""
    picked: List[str] = []
    missing: List[str] = []
    for wanted in stac_bands:
        match = next((key for key, asset in assets.items()
                      if isinstance(asset, dict) and asset.get("href")
                      and _norm(wanted) in asset_band_names(key, asset)),
                     None)
        if match is None:
            missing.append(wanted)
        else:
            picked.append(match)
    if missing:
        available = ", ".join(_describe(k, a) for k, a in assets.items() if isinstance(a, dict)) or "none"
        raise InputError(f"has no asset for band(s) {', '.join(missing)} (matched by eo:bands common_name or name, "
                         f"or the asset key); its assets: {available}")
    return picked


def item_spec(href: str, item: dict, stac_bands: Optional[Sequence[str]], model_bands: Sequence[str]) -> SceneSpec:
    if not stac_bands:
        raise ConfigError("input: a STAC item needs the model's STAC band names (model.geo.stac_bands, e.g. "
                          "[blue, green, red, nir08, swir16, swir22]); this model declares none")
    if len(stac_bands) != len(model_bands):
        raise ConfigError(f"model.geo.stac_bands: {len(stac_bands)} names for {len(model_bands)} model bands")
    name = shown(href)
    assets = item.get("assets")
    if item.get("type") != "Feature" or not isinstance(assets, dict):
        raise InputError(f"{name}: is not a STAC item (a GeoJSON Feature with assets); give an item's JSON, "
                         "not a collection or a search result")
    try:
        keys = pick_assets(assets, stac_bands)
    except InputError as e:
        raise InputError(f"{name}: {e}") from None
    files = tuple(resolve_href(assets[k]["href"], href) for k in keys)
    properties = item.get("properties") or {}
    when = properties.get("datetime") or properties.get("start_datetime")
    labels = tuple(f"asset {key} ({shown(file)})" for key, file in zip(keys, files))
    return SceneSpec(name=href, files=files, per_band=True, labels=labels, links=(name,), datetime=when)


def load_item(href: str, timeout_s: float) -> dict:
    """The item's JSON from a local file or an http(s) URL (`appliance run`: the user's own network), a URL
    within `timeout_s` (server.limits.fetch_timeout_s, the one rule for a URL's time)."""
    name = shown(href)
    try:
        if is_remote(href):
            if scheme(href) not in ("http", "https"):
                raise InputError(f"{name}: STAC items are read from files or http(s) URLs; their assets may be s3://")
            request = urllib.request.Request(href, headers={"User-Agent": "appliance"})
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                text = response.read(MAX_ITEM_BYTES + 1)
        else:
            with open(href, "rb") as f:
                text = f.read(MAX_ITEM_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise InputError(f"{name}: the STAC item could not be fetched (HTTP {e.code})") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
        raise InputError(f"{name}: the STAC item could not be read ({reason})") from None
    if len(text) > MAX_ITEM_BYTES:
        raise InputError(f"{name}: is over {MAX_ITEM_BYTES >> 20} MiB; expected one STAC item's JSON")
    return parse_item(text, name)


def parse_item(text: bytes, name: str) -> dict:
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{name}: is not valid JSON ({e}); expected a STAC item") from None
    if not isinstance(data, dict):
        raise InputError(f"{name}: is not a STAC item (a GeoJSON Feature with assets)")
    return data
