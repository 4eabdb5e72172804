"""Where a scene's pixels come from: one multi-band GeoTIFF, one GeoTIFF per model band, or a STAC item
whose assets are those per-band files; each local, `https://` / `http://` or `s3://`.

`scene_spec` turns one `input` entry into a `SceneSpec` (pure but for reading a STAC item's JSON);
`gdal_path` maps a URL to GDAL's virtual file systems (`/vsicurl/`, `/vsis3/`), which read by HTTP
range requests, a block at a time; `shown` is how messages name a URL (no query string, no user info:
a signed URL's query is a credential).
"""
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

from appliance.errors import InputError

REMOTE_SCHEMES = ("http", "https", "s3")


@dataclass(frozen=True)
class SceneSpec:
    name: str  # how messages and output names refer to the scene (the file, the first band's file, the item)
    files: Tuple[str, ...]  # one multi-band GeoTIFF, or one file per model band in the model's order
    per_band: bool
    labels: Tuple[str, ...] = ()  # per file, how messages name it (a STAC asset key; default the file)
    links: Tuple[str, ...] = ()  # what the mask derives from (the STAC item, else the files)
    datetime: Optional[str] = None
    # `appliance serve`: the request's remote_file.RemoteReads; http(s) files are read through the SSRF-safe
    # fetcher instead of GDAL's /vsicurl/. None: the CLI's and batch Job's own network.
    fetch: Any = None
    # A multi-date scene (multidate.py): one SceneSpec per date, in order; `files`, `labels` and `links`
    # then hold every date's, date after date. Empty: one date.
    dates: Tuple["SceneSpec", ...] = ()

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels else shown(self.files[index])


def scheme(href: str) -> str:
    return urllib.parse.urlsplit(href).scheme.lower() if "://" in href else ""


def is_remote(href: str) -> bool:
    return scheme(href) in REMOTE_SCHEMES


def gdal_path(href: str) -> str:
    """What GDAL opens: local paths as they are, http(s) URLs through /vsicurl/, s3://bucket/key as
    /vsis3/bucket/key (credentials and endpoint from GDAL's and AWS's environment variables)."""
    kind = scheme(href)
    if kind in ("http", "https"):
        return "/vsicurl/" + href
    if kind == "s3":
        return "/vsis3/" + href.split("://", 1)[1]
    if kind:
        raise InputError(f"input: unsupported URL scheme {kind}:// in {shown(href)}; give a local path, an "
                         "https:// or http:// URL or an s3://bucket/key", param="input")
    return href


def shown(href: str) -> str:
    """A URL without its query string, fragment and user info; a path unchanged."""
    if not is_remote(href):
        return href
    parts = urllib.parse.urlsplit(href)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def is_stac_item(href: str) -> bool:
    path = urllib.parse.urlsplit(href).path if is_remote(href) else href
    return path.lower().endswith(".json")


def stem(href: str) -> str:
    """`a/b/HLS.B02.tif` -> `HLS.B02`; `https://h/x/item.json?sig=1` -> `item`."""
    path = urllib.parse.urlsplit(href).path if is_remote(href) else href
    name = os.path.basename(path.rstrip("/")) or "scene"
    base, suffix = os.path.splitext(name)
    return base if suffix.lower() in (".tif", ".tiff", ".json") else name


def resolve_href(href: str, base: str) -> str:
    """An asset's href relative to the item it came from (a URL or a local file)."""
    if is_remote(href) or os.path.isabs(href):
        return href
    if is_remote(base):
        return urllib.parse.urljoin(base, href)
    return os.path.normpath(os.path.join(os.path.dirname(base), href))


def scene_spec(value: Any, stac_bands: Optional[Sequence[str]], model_bands: Sequence[str],
               load_item: Callable[[str], dict], field: str = "input") -> SceneSpec:
    """One `input` entry: a path or URL of a GeoTIFF or a STAC item (`.json`), or a list of per-band
    GeoTIFFs in the model's band order. `field` names the entry in messages (a server: `data.data`)."""
    from appliance.stages.geo.stac_in import item_spec  # STAC parsing lives apart

    if isinstance(value, (list, tuple)):
        files = tuple(str(v) for v in value)
        if len(files) != len(model_bands):
            raise InputError(f"{field}: {len(files)} per-band files given but the model takes {len(model_bands)} "
                             f"bands ({', '.join(model_bands)}), one file each in that order", param=field)
        return SceneSpec(name=files[0], files=files, per_band=True, links=tuple(shown(f) for f in files))
    href = str(value)
    if is_stac_item(href):
        return item_spec(href, load_item(href), stac_bands, model_bands)
    return SceneSpec(name=href, files=(href,), per_band=False, links=(shown(href),))
