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

A multi-date model's (`frames` T > 1) scene is a list of T dates (URLs, STAC items, allowed files or
uploads) or one stacked file, by multidate.py's rules; date i's problems name `field[i]` (`request_fields`,
`named_error`: how an error about a file names the request's field, never a server path).
"""
import urllib.parse
from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

from appliance.errors import InputError, UserError
from appliance.stages.geo.multidate import check_date_count, dates_spec, multidate_spec
from appliance.stages.geo.remote_file import RemoteReads
from appliance.stages.geo.scene_sources import SceneSpec, is_remote, scene_spec, scheme, shown
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


def served_scene_spec(value: Any, geo, policy, field: str, s3_buckets: Sequence[str], frames: int = 1) -> SceneSpec:
    """The scene of a request's `value` (a URL, or a list of per-band URLs in the model's band order; for a
    T-date model a list of T dates or one stacked file); a STAC item's JSON is fetched under `policy`, and
    its assets, like every file, are checked above. The spec's `fetch` (a RemoteReads, each date's too)
    holds the request's kept connections: the caller closes it."""
    from appliance.fetch import fetch_bytes

    reads = RemoteReads(policy, field)

    def load_item(url: str) -> dict:  # its connection is kept for the band files on the same host
        return parse_item(fetch_bytes(url, policy, field, connections=reads.connections), shown(url))

    hrefs = value if isinstance(value, (list, tuple)) else [value]
    for href in hrefs:  # before fetching anything
        check_served_href(str(href), field, s3_buckets)
    stac_bands = list(geo.stac_bands) if geo.get("stac_bands") else None
    try:
        if frames > 1:
            spec = multidate_spec(value, frames, stac_bands, list(geo.bands), load_item, field, date_fields=True)
        else:
            spec = scene_spec(value, stac_bands, list(geo.bands), load_item, field)
        for file in spec.files:
            check_served_href(file, field, s3_buckets)
    except InputError as e:  # the item's own problems name the item: the client's field leads
        reads.close()
        if e.param is not None and e.param.startswith(field):
            raise
        raise InputError(f"{field}: {e}", param=field, status=e.status) from None
    except BaseException:
        reads.close()
        raise
    # every date reads through the fetcher too (multidate.check_dates opens each date by its own spec)
    return replace(spec, fetch=reads, dates=tuple(replace(date, fetch=reads) for date in spec.dates))


UPLOAD_NAME = "upload"


def upload_scene_spec(path: Any, field: str, model_bands: Sequence[str] = (), frames: int = 1) -> SceneSpec:
    """The scene a request sent as bytes, spooled at `path` (for a T-date model, a list of T spooled dates);
    messages name the request's `field` (date i: `field[i]`)."""
    if isinstance(path, (list, tuple)):
        check_date_count(path, frames, model_bands, field, shown_as=lambda _: "upload")
        return dates_spec([upload_scene_spec(p, f"{field}[{i}]") for i, p in enumerate(path)])
    return SceneSpec(name=UPLOAD_NAME, files=(path,), per_band=False, labels=(field,))


def local_scene_spec(paths: Sequence[str], geo, field: str, frames: int = 1) -> SceneSpec:
    """Per-band files on the server (each already inside `server.allowed_local_media_dir`); for a T-date
    model, its T dates."""
    def no_item(href: str) -> dict:
        raise InputError(f"{field}: files on the server are GeoTIFFs; give a STAC item by its URL", param=field)

    if frames > 1:
        return multidate_spec(list(paths), frames, None, list(geo.bands), no_item, field, date_fields=True)
    return scene_spec(list(paths), None, list(geo.bands), no_item, field)


def request_fields(entries: Any, field: str, spec: Optional[SceneSpec], frames: int) -> Dict[str, str]:
    """{a file the request named (a server path; for a T-date model also a URL, or a STAC asset's label):
    the request's field for it}: a list's entry i is `field[i]`, a lone entry `field`."""
    listed = isinstance(entries, (list, tuple))
    fields: Dict[str, str] = {}
    for i, entry in enumerate(entries if listed else [entries]):
        if entry and (frames > 1 or not is_remote(entry)):
            fields[entry] = fields[shown(entry)] = f"{field}[{i}]" if listed else field
    for i, date in enumerate(spec.dates if spec is not None else ()):
        for k, file in enumerate(date.files):
            fields[file] = fields[date.label(k)] = f"{field}[{i}]"
    return fields


def named_error(error: UserError, field: str, fields: Dict[str, str], server_paths: Sequence[str]) -> UserError:
    """`error` with the server's own paths (spooled uploads, allowed files) replaced by the request's fields,
    and its `param` the field of the file it is about: its param's, else that of the file its message
    starts with (an error about a URL carries no param)."""
    message = str(error)
    for path in server_paths:
        if path in fields:
            message = message.replace(path, fields[path])
    param = fields.get(error.param) if error.param is not None else None
    if param is None and error.param in (None, field):
        param = next((named for name, named in fields.items() if str(error).startswith(name + ":")), None)
    param = param or error.param
    if isinstance(error, InputError):
        return InputError(message, param, error.status)
    return type(error)(message, param)
