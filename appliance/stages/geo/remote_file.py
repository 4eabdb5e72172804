"""A remote GeoTIFF read through the SSRF-safe fetcher, for `appliance serve`: GDAL's own /vsicurl/
follows redirects itself and resolves the host again after any check of ours, so a public server
cannot use it for user URLs. Here every range GET is `fetch.fetch_range`: the host is resolved once and
must be public (or in `server.allowed_media_domains`), the connection goes to the vetted address,
redirects are followed by hand and re-checked, each request is time-bounded.

`RangeFile` is the file object rasterio's `opener` hands to GDAL: reads come in aligned chunks kept in
a small LRU cache (GDAL reads a TIFF's header and tile index in many small pieces). `opener_for`
serves exactly one URL and answers GDAL's sidecar probes (.aux.xml, .msk, ...) as missing files.
"""
import io
from collections import OrderedDict
from typing import Callable, List

from appliance.errors import InputError
from appliance.fetch.client import fetch_range
from appliance.fetch.policy import FetchPolicy

CHUNK_BYTES = 256 << 10
CACHED_CHUNKS = 32  # 8 MiB a file


class RangeFile(io.RawIOBase):
    def __init__(self, url: str, policy: FetchPolicy, field: str, max_total_bytes: int):
        super().__init__()
        self.url, self.policy, self.field = url, policy, field
        self.max_total_bytes, self.fetched = max_total_bytes, 0
        self.chunks: "OrderedDict[int, bytes]" = OrderedDict()
        self.pos = 0
        first, self.size = self._get(0)
        if self.size < 0:
            raise InputError(f"{field}: the server did not say the file's size (Content-Range); it must answer "
                             "HTTP range requests")
        self._keep(0, first)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self.size - self.pos))
        done = 0
        while done < want:
            index, start = divmod(self.pos, CHUNK_BYTES)
            chunk = self._chunk(index)
            piece = chunk[start:start + want - done]
            if not piece:
                break
            view[done:done + len(piece)] = piece
            done += len(piece)
            self.pos += len(piece)
        return done

    def _chunk(self, index: int) -> bytes:
        if index in self.chunks:
            self.chunks.move_to_end(index)
            return self.chunks[index]
        data, _ = self._get(index)
        self._keep(index, data)
        return data

    def _get(self, index: int):
        start = index * CHUNK_BYTES  # a range past the end is clipped by the server (RFC 9110)
        data, size = fetch_range(self.url, start, start + CHUNK_BYTES - 1, self.policy, self.field)
        self.fetched += len(data)
        if self.fetched > self.max_total_bytes:
            raise InputError(f"{self.field}: reading the scene took more than {self.max_total_bytes} bytes from "
                             "its host; the limit is server.limits.max_media_bytes")
        return data, size

    def _keep(self, index: int, data: bytes) -> None:
        self.chunks[index] = data
        while len(self.chunks) > CACHED_CHUNKS:
            self.chunks.popitem(last=False)


def opener_for(url: str, policy: FetchPolicy, field: str, max_total_bytes: int,
               errors: List[InputError]) -> Callable:
    """rasterio's `opener`: the scene's URL opens as a RangeFile; any other name GDAL asks for is missing.
    GDAL turns an exception in the opener into its own terse error: the fetcher's InputError (which says
    what was refused and why) is kept in `errors` for the caller to raise instead."""
    def opener(path: str, mode: str = "rb"):
        if path != url or "w" in mode or "+" in mode:
            raise FileNotFoundError(path)
        try:
            return RangeFile(url, policy, field, max_total_bytes)
        except InputError as e:
            errors.append(e)
            raise
    return opener
