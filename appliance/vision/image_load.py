"""Load a user's image (bytes, http(s) URL, data: URL or an allowed local file) as an upright RGB image.

Every problem the user can cause becomes `InputError("<field>: what is wrong; what is allowed")`:
bad base64, a non-image mime type, a fetch that fails or is refused (appliance.fetch: private
addresses, timeouts, redirects), a path outside the allowed directory, too many bytes, too many pixels
(checked from the header, before decoding), a file that is not an image or is truncated. Nothing here
raises a bare OSError at the caller.

`content_hash` keys the encoder cache and the prefix cache: it hashes the decoded RGB pixels and the
size, so the same picture sent as a URL, a data URL or raw bytes gets the same key, and two pictures
that differ in one pixel do not.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import struct
import urllib.parse
import warnings
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from appliance.errors import InputError
from appliance.fetch import FetchPolicy, Fetcher, fetch_bytes
from appliance.fetch.local_files import allowed_path
from appliance.vision.tiff_layout import tiff_layout


@dataclass(frozen=True)
class LoadedImage:
    image: Image.Image  # mode "RGB", EXIF orientation applied
    content_hash: str   # hex sha256 of size + RGB pixels

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), PIL order."""
        return self.image.size


def load_image(
    source: Union[str, bytes, bytearray, memoryview],
    *,
    field: str = "image",
    max_bytes: int,
    max_image_pixels: int,
    fetch_policy: FetchPolicy,
    allowed_dir: Optional[Union[str, os.PathLike]] = None,
    fetcher: Optional[Fetcher] = None,
) -> LoadedImage:
    """Read `source` (raw bytes, `http(s)://`, `data:image/...;base64,`, or a path under `allowed_dir`).

    The limits are the server's (`server.limits.max_media_bytes`, `max_image_pixels`, and
    `FetchPolicy.from_server_config`), passed in so that this module holds no second copy of them.
    URLs go through `fetcher(url, policy, field)` (default: the safe `appliance.fetch.fetch_bytes`)."""
    data = read_source(source, field=field, max_bytes=max_bytes, allowed_dir=allowed_dir,
                       fetch_policy=fetch_policy, fetcher=fetcher)
    image = decode_image(data, field=field, max_image_pixels=max_image_pixels)
    return LoadedImage(image=image, content_hash=content_hash(image))


def is_remote_image(source) -> bool:
    """An image the request carries itself (data: URL) or names on the web (http(s)): no server file."""
    return isinstance(source, str) and (source[:16].lower().startswith("data:") or is_web_image(source))


def is_web_image(source) -> bool:
    """An image named on the web (http(s)): reading it takes the network."""
    return isinstance(source, str) and source[:16].lower().startswith(("http://", "https://"))


def read_source(source, *, field: str = "image", max_bytes: int, fetch_policy: FetchPolicy,
                allowed_dir=None, fetcher: Optional[Fetcher] = None) -> bytes:
    """The encoded bytes behind `source`, at most `max_bytes` of them."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        _check_byte_count(len(data), field, max_bytes)
        return data
    if not isinstance(source, str):
        raise InputError(f"{field}: expected bytes or a string (URL, data URL or path), "
                         f"got {type(source).__name__}", param=field)
    if not source.strip():
        raise InputError(f"{field}: empty; pass an http(s) URL, a data:image/...;base64 URL or a path", param=field)
    lowered = source[:16].lower()
    if lowered.startswith("data:"):
        return decode_data_url(source, field=field, max_bytes=max_bytes)
    if is_web_image(source):
        data = fetch_remote(source, fetch_policy, field, fetcher)
        _check_byte_count(len(data), field, max_bytes)
        return data
    if lowered.startswith("file://"):
        return read_local(urllib.parse.unquote(urllib.parse.urlparse(source).path), field=field,
                          max_bytes=max_bytes, allowed_dir=allowed_dir)
    if "://" in source[:32]:
        scheme = source.split("://", 1)[0]
        raise InputError(f"{field}: unsupported URL scheme {scheme!r}; "
                         "allowed: http://, https://, data:image/...;base64, or a local path", param=field)
    return read_local(source, field=field, max_bytes=max_bytes, allowed_dir=allowed_dir)


def fetch_remote(url: str, policy: FetchPolicy, field: str, fetcher: Optional[Fetcher] = None) -> bytes:
    """`fetcher` (default: the safe fetcher) on `url`; whatever an injected fetcher raises is an InputError.
    The default raises only InputError for the URL's faults, so anything else from it is a bug and stays one."""
    if fetcher is None:
        return fetch_bytes(url, policy, field)
    try:
        data = fetcher(url, policy, field)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a fetch failure is the user's URL, never a server error
        host = urllib.parse.urlsplit(url).hostname or "the URL"  # never the query string or userinfo
        raise InputError(f"{field}: could not fetch the image from {host} ({type(e).__name__}); "
                         "the URL must be reachable over http(s) from the server", param=field) from None
    if not isinstance(data, (bytes, bytearray)):
        raise InputError(f"{field}: fetching the image from {urllib.parse.urlsplit(url).hostname} "
                         "returned no bytes", param=field)
    return bytes(data)


def _check_byte_count(n: int, field: str, max_bytes: int) -> None:
    if n > max_bytes:
        raise InputError(f"{field}: image is {n} bytes; the limit is {max_bytes} bytes", param=field)
    if n == 0:
        raise InputError(f"{field}: image is empty (0 bytes); send an encoded PNG, JPEG, WebP, GIF or BMP", param=field)


# --- data: URLs -------------------------------------------------------------------------------

def decode_data_url(url: str, *, field: str = "image", max_bytes: int) -> bytes:
    """`data:image/<type>;base64,<payload>` → bytes. Only base64 image payloads are accepted."""
    header, sep, payload = url.partition(",")
    if not sep:
        raise InputError(f"{field}: data URL has no ',' before the payload; "
                         "expected data:image/<type>;base64,<payload>", param=field)
    params = [p.strip() for p in header[len("data:"):].split(";")]
    mime = params[0].lower()
    if not mime.startswith("image/") or mime == "image/":
        raise InputError(f"{field}: data URL mime type is {mime or 'missing'!r}; "
                         "allowed: image/* (e.g. image/png, image/jpeg)", param=field)
    if "base64" not in (p.lower() for p in params[1:]):
        raise InputError(f"{field}: data URL is not base64-encoded; expected data:{mime};base64,<payload>", param=field)
    payload = "".join(payload.split())  # line breaks and spaces are common in pasted payloads
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise InputError(f"{field}: image is about {len(payload) // 4 * 3} bytes; the limit is {max_bytes} bytes",
                         param=field)
    payload += "=" * (-len(payload) % 4)  # tolerate missing padding
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{field}: data URL payload is not valid base64; "
                         "allowed: standard base64 (A-Z a-z 0-9 + / =)", param=field) from None
    _check_byte_count(len(data), field, max_bytes)
    found = sniff_format(data)
    declared = DECLARED_FORMATS.get(mime.split("/", 1)[1])
    if declared and found and declared != found:
        raise InputError(f"{field}: the data URL says {mime} but the data is {found}; "
                         f"label it data:image/{found.lower()};base64,...", param=field)
    return data


# Magic bytes of the formats a data URL may declare; `sniff_format` -> Pillow's format name.
MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
         (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
DECLARED_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "pjpeg": "JPEG", "gif": "GIF", "webp": "WEBP",
                    "bmp": "BMP", "x-ms-bmp": "BMP", "tiff": "TIFF"}


def sniff_format(data: bytes) -> Optional[str]:
    """The image format the bytes start with, for the formats data URLs declare; None if unknown."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in MAGIC if data.startswith(magic)), None)


# --- local files ------------------------------------------------------------------------------

def read_local(path: str, *, field: str = "image", max_bytes: int, allowed_dir=None) -> bytes:
    """Read a file that resolves to a place inside `allowed_dir` (`fetch.local_files.allowed_path`)."""
    candidate = allowed_path(path, allowed_dir, field)
    try:
        with open(candidate, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            _check_byte_count(size, field, max_bytes)
            data = f.read(max_bytes + 1)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{field}: no such file {path!r} in the image directory", param=field) from None
    except IsADirectoryError:
        raise InputError(f"{field}: {path!r} is a directory; give an image file", param=field) from None
    except OSError as e:
        raise InputError(f"{field}: cannot read {path!r} ({e.strerror or e})", param=field) from None
    _check_byte_count(len(data), field, max_bytes)
    return data


# --- decoding ---------------------------------------------------------------------------------

def decode_image(data: bytes, *, field: str = "image", max_image_pixels: int) -> Image.Image:
    """Encoded bytes → upright RGB. The pixel count is checked from the header before decoding."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_image_pixels:
                raise InputError(f"{field}: image is {width}x{height} = {width * height} pixels; "
                                 f"the limit is {max_image_pixels} pixels", param=field)
            if width <= 0 or height <= 0:
                raise InputError(f"{field}: image has no pixels ({width}x{height})", param=field)
            frames = getattr(image, "n_frames", 1)
            if frames > 1 and image.format != "TIFF":  # (multi-page TIFFs are band stacks, not motion)
                raise InputError(f"{field}: an animated {image.format} ({frames} frames); which frame the "
                                 "question is about is ambiguous: send one frame as a still image", param=field)
            image.load()
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        raise InputError(f"{field}: image is too large to decode ({e}); "
                         f"the limit is {max_image_pixels} pixels", param=field) from None
    except UnidentifiedImageError:
        raise InputError(f"{field}: {_unreadable(data)}", param=field) from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        raise InputError(f"{field}: the image data is truncated or corrupt ({e}); "
                         "send the complete file", param=field) from None
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - unreadable EXIF: keep the stored orientation
        pass
    return to_rgb(image)


ACCEPTED = "PNG, JPEG, WebP, GIF, BMP, or a TIFF of 8-bit grey, RGB or RGBA, or of one 16- or 32-bit band"


def _unreadable(data: bytes) -> str:
    """Why bytes Pillow could not identify are refused: for a TIFF, its bands and sample size (a 6-band
    GeoTIFF is a raster for a geospatial pipeline, not a picture)."""
    layout = tiff_layout(data)
    if layout is None:
        return f"not an image Pillow can read; send {ACCEPTED}"
    samples, bits = layout
    scene = "; a multi-band scene is for a geospatial pipeline such as prithvi_flood" if samples > 4 else ""
    return (f"a TIFF with {samples} band{'s' if samples != 1 else ''} of {bits}-bit samples, which is not a picture "
            f"this model can take: it takes RGB or greyscale images ({ACCEPTED}){scene}")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode → RGB. Transparency is composited on white; 16-bit and float are scaled to 8 bits."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        return Image.fromarray(_to_uint8(np.asarray(image), mode)).convert("RGB")
    has_alpha = "A" in image.getbands() or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV, RGBX, ...


def _to_uint8(array: np.ndarray, mode: str) -> np.ndarray:
    array = array.astype(np.float64)
    if mode == "F":
        scale = 255.0 if array.size and np.nanmax(array) <= 1.0 else 1.0
    elif mode == "I" and array.size and np.max(array) <= 255:
        scale = 1.0  # an 8-bit image stored as 32-bit ints
    else:
        scale = 255.0 / 65535.0  # 16-bit samples
    return np.clip(np.rint(np.nan_to_num(array) * scale), 0, 255).astype(np.uint8)


def content_hash(image: Image.Image) -> str:
    """Hex sha256 of the RGB pixels and the size: equal pictures get equal keys however they arrived."""
    rgb = to_rgb(image)
    digest = hashlib.sha256(f"rgb:{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()
