"""Fetch an image over http(s) with a time limit and a byte limit; every failure is an InputError.

`fetch_url` takes an injectable `fetcher(url, timeout_s, max_bytes) -> bytes` so tests never touch the
network; the default, `urllib_fetch`, follows only http(s) redirects, stops reading past `max_bytes`
and enforces `timeout_s` on the whole transfer (checked between reads; one read may take up to
`timeout_s` itself). It does not block private or link-local addresses: put the server behind an
egress policy, or pass a fetcher that does, before exposing URL inputs to untrusted users.
"""
from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional

from appliance.errors import InputError

DEFAULT_TIMEOUT_S = 10.0

# fetcher(url, timeout_s, max_bytes) -> body; may raise anything, which becomes an InputError.
Fetcher = Callable[[str, float, int], bytes]


def fetch_url(url: str, *, field: str = "image", max_bytes: int = 20 * 1024 * 1024,
              fetcher: Optional[Fetcher] = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """Fetch with `fetcher` (default: urllib). Any failure is an InputError naming the URL's host."""
    host = urllib.parse.urlparse(url).netloc or url[:64]
    try:
        data = (fetcher or urllib_fetch)(url, timeout_s, max_bytes)
    except InputError:
        raise
    except TimeoutError:
        raise InputError(f"{field}: fetching the image from {host} timed out after {timeout_s:g} s; "
                         "use a faster host or send the image inline as a data URL") from None
    except _TooLarge as e:
        raise InputError(f"{field}: image at {host} is {e} bytes; the limit is {max_bytes} bytes") from None
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:  # urllib refuses redirects to file:// and the like with the 3xx itself
            raise InputError(f"{field}: fetching the image from {host} redirected to a non-http(s) URL; "
                             "only http(s) redirects are followed") from None
        raise InputError(f"{field}: fetching the image from {host} failed with HTTP {e.code}; "
                         "the URL must return the image with status 200") from None
    except Exception as e:  # noqa: BLE001 - a fetch failure is the user's URL, never a server error
        reason = getattr(e, "reason", None) or e
        if "non-http(s) URL" in str(reason):
            raise InputError(f"{field}: fetching the image from {host} redirected to a non-http(s) URL; "
                             "only http(s) redirects are followed") from None
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise InputError(f"{field}: fetching the image from {host} timed out after {timeout_s:g} s; "
                             "use a faster host or send the image inline as a data URL") from None
        raise InputError(f"{field}: could not fetch the image from {host} ({type(e).__name__}: {reason}); "
                         "the URL must be reachable over http(s) from the server") from None
    if not isinstance(data, (bytes, bytearray)):
        raise InputError(f"{field}: fetching the image from {host} returned no bytes")
    if len(data) > max_bytes:
        raise InputError(f"{field}: image at {host} is {len(data)} bytes; the limit is {max_bytes} bytes")
    return bytes(data)


class _TooLarge(Exception):
    """Raised by a fetcher when the body passes max_bytes; the message is the size seen (or '>N')."""


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlparse(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"redirect to a non-http(s) URL {newurl[:64]!r}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects())


def urllib_fetch(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """GET `url`; the whole fetch (not just each socket read) must finish within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"User-Agent": "appliance-image-loader"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        length = response.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise _TooLarge(length)
        chunks, total = [], 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("image fetch deadline passed")
            chunk = response.read(min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise _TooLarge(f">{max_bytes}")
    return b"".join(chunks)
