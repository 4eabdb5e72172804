"""Scenes named by a server request (`appliance serve`'s `/pooling`): a GeoTIFF URL, a STAC item URL, or
a list of per-band URLs, by the CLI's own rules (`scene_sources.scene_spec`), with what a public server adds:

- http(s) files and STAC items are read through the SSRF-safe fetcher (`remote_file.py`: every range
  request re-resolves nothing, re-checks redirects, is time- and size-bounded), never GDAL's /vsicurl/,
  which follows redirects itself and resolves the host again after any check;
- `s3://bucket/key` is read by GDAL's /vsis3/ with the server's own credentials, so a client may name
  only the buckets the operator lists in `server.allowed_s3_buckets` (none by default): otherwise any
  object those credentials reach would be readable by any client;
- nothing else (a STAC item naming `/etc/...` or `file://`) is read.

A scene sent as the request's bytes (base64, or `/v1/pool`'s body) is spooled to a file whose name is the
server's own: the mask's `source` tag and its STAC item call it `upload` instead, with no `derived_from`
link (the spool file is gone once answered).
"""
import urllib.parse
from dataclasses import replace
from typing import Any, List, Sequence

from appliance.errors import InputError
from appliance.stages.geo.remote_file import RemoteReads
from appliance.stages.geo.scene_sources import SceneSpec, scene_spec, scheme, shown
from appliance.stages.geo.stac_in import parse_item


def allowed_s3_buckets(server_cfg) -> List[str]:
    """`server.allowed_s3_buckets`: the buckets a request may name (none unless the operator lists them)."""
    return list(server_cfg.get("allowed_s3_buckets") or [])


def check_served_href(href: str, field: str, s3_buckets: Sequence[str]) -> None:
    """InputError (naming `field`) unless the server may read `href` for a client."""
    kind = scheme(href)
    if kind in ("http", "https"):
        return
    if kind == "s3":
        bucket = urllib.parse.urlsplit(href).netloc
        if bucket in s3_buckets:
            return
        allowed = ", ".join(s3_buckets) if s3_buckets else "none"
        raise InputError(f"{field}: {shown(href)}: bucket {bucket!r} is not one this server reads (allowed: "
                         f"{allowed}); the operator lists buckets in server.allowed_s3_buckets", param=field)
    raise InputError(f"{field}: {shown(href)} is not an http(s) URL; the server reads files by http(s) URLs "
                     "(and s3:// in the buckets it allows) only", param=field)


def served_scene_spec(value: Any, geo, policy, field: str, s3_buckets: Sequence[str]) -> SceneSpec:
    """The scene of a request's `value` (a URL, or a list of per-band URLs in the model's band order);
    a STAC item's JSON is fetched under `policy`, and its assets, like every file, are checked above.
    The spec's `fetch` (a RemoteReads) holds the request's kept connections: the caller closes it."""
    from appliance.fetch import fetch_bytes

    reads = RemoteReads(policy, field)

    def load_item(url: str) -> dict:  # its connection is kept for the band files on the same host
        return parse_item(fetch_bytes(url, policy, field, connections=reads.connections), shown(url))

    hrefs = value if isinstance(value, (list, tuple)) else [value]
    for href in hrefs:  # before fetching anything
        check_served_href(str(href), field, s3_buckets)
    stac_bands = list(geo.stac_bands) if geo.get("stac_bands") else None
    try:
        spec = scene_spec(value, stac_bands, list(geo.bands), load_item, field)
        for file in spec.files:
            check_served_href(file, field, s3_buckets)
    except InputError as e:  # the item's own problems name the item: the client's field leads
        reads.close()
        if e.param == field:
            raise
        raise InputError(f"{field}: {e}", param=field, status=e.status) from None
    except BaseException:
        reads.close()
        raise
    return replace(spec, fetch=reads)


UPLOAD_NAME = "upload"


def upload_scene_spec(path: str, field: str) -> SceneSpec:
    """The scene a request sent as bytes, spooled at `path`; messages name the request's `field`."""
    return SceneSpec(name=UPLOAD_NAME, files=(path,), per_band=False, labels=(field,))


def local_scene_spec(paths: Sequence[str], geo, field: str) -> SceneSpec:
    """Per-band files on the server (each already inside `server.allowed_local_media_dir`)."""
    def no_item(href: str) -> dict:
        raise InputError(f"{field}: a per-band list names GeoTIFFs, not STAC items", param=field)

    return scene_spec(list(paths), None, list(geo.bands), no_item, field)
