"""Opening GeoTIFFs, local or remote, with clear errors, and checking one is complete before a run
reads it (`probe_geotiff`: the header and block table only; a remote file's header). Reads no pixel.

A URL (https://, s3://) is opened through GDAL's virtual file systems with `REMOTE_OPTIONS` in force
while it is open; in serve mode (`fetch`: the request's `remote_file.RemoteReads`) http(s) files go
through the SSRF-safe fetcher instead.
"""
import contextlib
import os
import warnings
from typing import Iterator, List, Optional

import rasterio
from rasterio.enums import Interleaving
from rasterio.errors import NotGeoreferencedWarning, RasterioError

from appliance.errors import InputError
from appliance.stages.geo.scene_sources import gdal_path, is_remote, scheme, shown

MAX_BLOCKS_CHECKED = 200_000  # the block-table check costs time per block: bounded for huge scenes


# GDAL's options while a remote file is open (scoped to the reader, never os.environ): no directory
# listing probes next to the file, bounded waits with retries, adjacent block ranges merged.
REMOTE_OPTIONS = dict(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR", GDAL_HTTP_CONNECTTIMEOUT=10, GDAL_HTTP_TIMEOUT=60,
                      GDAL_HTTP_MAX_RETRY=2, GDAL_HTTP_RETRY_DELAY=0.5, GDAL_HTTP_MERGE_CONSECUTIVE_RANGES="YES",
                      CPL_VSIL_CURL_ALLOWED_EXTENSIONS=".tif,.tiff,.TIF,.TIFF")


@contextlib.contextmanager
def open_raster(path: str, label: Optional[str] = None, fetch=None) -> Iterator[rasterio.DatasetReader]:
    """rasterio.open without the not-georeferenced warning (we log our own) and with clear errors. `path`
    may be a URL (https://, s3://), read by range requests with REMOTE_OPTIONS in force while it is open;
    with `fetch` (serve mode: the request's `remote_file.RemoteReads`) through the SSRF-safe fetcher.
    `label` names it in messages (default: the path, or the URL without its query string)."""
    remote = is_remote(path)
    name = label or shown(path)
    with contextlib.ExitStack() as stack:
        if remote:
            stack.enter_context(rasterio.Env(**REMOTE_OPTIONS))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NotGeoreferencedWarning)
                fetched = fetch and scheme(path) in ("http", "https")  # s3: GDAL's /vsis3/, buckets checked before
                dataset = _open_remote(path, name, fetch) if fetched else rasterio.open(gdal_path(path))
        except RasterioError as e:
            if remote:
                where = f"{fetch.field}: {name}" if fetch else name  # serve mode: the request's field leads
                raise InputError(f"{where}: cannot be opened ({first_line(e)}); the URL must answer HTTP range "
                                 "requests with a GeoTIFF (for s3://, set AWS_* credentials in the environment)",
                                 param=fetch.field if fetch else None) from None
            if _looks_like_tiff(path):
                raise InputError(
                    f"{name}: is truncated or corrupt ({first_line(e)}); re-download or re-export it", param=name
                ) from None
            raise InputError(f"{name}: cannot be read as a GeoTIFF ({first_line(e)}); expected a .tif scene",
                             param=name) from None
        with dataset:
            yield dataset


def _open_remote(url: str, name: str, fetch) -> rasterio.DatasetReader:
    from appliance.stages.geo.remote_file import opener_for

    errors: List[InputError] = []
    try:
        return rasterio.open(url, opener=opener_for(url, fetch, errors))
    except RasterioError as e:
        if errors:
            raise errors[-1] from None
        raise InputError(f"{fetch.field}: {name}: cannot be read as a GeoTIFF ({first_line(e)})",
                         param=fetch.field) from None


def _looks_like_tiff(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return False
    return magic in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # TIFF and BigTIFF


def probe_geotiff(path: str, label: Optional[str] = None, fetch=None) -> None:
    """InputError unless `path` is a non-empty GeoTIFF whose blocks all lie inside the file (for a URL:
    whose header reads; a truncated remote file fails at its first missing block, before any output)."""
    if is_remote(path):
        with open_raster(path, label, fetch) as ds:
            _check_header(ds, label or shown(path))
        return
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file", param=path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: is not a file; expected a GeoTIFF scene", param=path)
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: is not readable (permission denied)", param=path)
    with open_raster(path, label) as ds:
        _check_header(ds, label or path)
        _check_blocks_inside(ds, path)


def _check_header(ds, name: str) -> None:
    if ds.driver != "GTiff":
        raise InputError(f"{name}: is a {ds.driver} file, not a GeoTIFF; convert it (gdal_translate -of GTiff)",
                         param=file_param(name))
    if ds.width < 1 or ds.height < 1 or ds.count < 1:
        raise InputError(f"{name}: is empty ({ds.width}x{ds.height} pixels, {ds.count} bands)",
                         param=file_param(name))


def _check_blocks_inside(ds, path: str) -> None:
    """A truncated TIFF opens fine but has blocks past the end of the file: catch it up front."""
    size = os.path.getsize(path)
    block_h, block_w = ds.block_shapes[0]
    rows, cols = -(-ds.height // block_h), -(-ds.width // block_w)
    per_band = ds.interleaving is Interleaving.band
    bands = range(1, ds.count + 1) if per_band else [1]
    if rows * cols * len(bands) > MAX_BLOCKS_CHECKED:  # huge scene: check the last row of blocks only
        cells = [(r, c) for r in [rows - 1] for c in range(cols)]
    else:
        cells = [(r, c) for r in range(rows) for c in range(cols)]
    for band in bands:
        for r, c in cells:
            offset = ds.get_tag_item(f"BLOCK_OFFSET_{c}_{r}", "TIFF", bidx=band)
            length = ds.get_tag_item(f"BLOCK_SIZE_{c}_{r}", "TIFF", bidx=band)
            if offset is None or length is None:
                return  # driver does not expose the block table (not expected for GTiff)
            if int(offset) + int(length) > size:
                raise InputError(
                    f"{path}: is truncated or corrupt (block {r},{c} of band {band} ends at byte "
                    f"{int(offset) + int(length)}, the file has {size}); re-download or re-export it", param=path
                )


def file_param(name: str) -> Optional[str]:
    """The `param` of an error about the file `name`: its local name (a server maps the files it was sent
    to the request's fields, `serving/engine_process/pool_driver.py`); a URL names no field."""
    return None if is_remote(name) else name


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
