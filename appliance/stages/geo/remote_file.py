"""A remote GeoTIFF read through the SSRF-safe fetcher, for `appliance serve`: GDAL's own /vsicurl/
follows redirects itself and resolves the host again after any check of ours, so a public server
cannot use it for user URLs. Here every range GET is `fetch.fetch_range`: the host is resolved once and
must be public (or in `server.allowed_media_domains`), the connection goes to the vetted address,
redirects are followed by hand and re-checked, each request is time-bounded.

`RangeFile` is the file object rasterio's `opener` hands to GDAL: each read is one range request for
the aligned 64 KiB chunks it lacks (GDAL reads a block in one call, so a block costs about its own
size), plus, when reads go on in file order (a row of a COG's blocks), a growing read-ahead of up to
512 KiB, kept in a small LRU cache (GDAL reads a TIFF's header and tile index in many small pieces). `RemoteReads` is
one request's state: GDAL opens a file three times in a run (probe, describe, read), and the chunks,
the file's size and the bytes fetched live here, per URL, so its header crosses the network once and
`server.limits.max_media_bytes` bounds what one file may cost the request in all. Its `connections`
(fetch/kept_connections.py) keep one request's connections alive between range GETs, so a scene costs a handful of
TCP connections, not one per GET; `close()` at the end of the request closes them.
`opener_for` serves exactly one URL and answers GDAL's sidecar probes (.aux.xml, .msk, ...) as missing
files.
"""
import dataclasses  # `dataclasses.field`: RemoteReads has an attribute named `field`
import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, List

from appliance.errors import InputError
from appliance.fetch.client import fetch_range
from appliance.fetch.policy import FetchPolicy
from appliance.fetch.kept_connections import KeptConnections

CHUNK_BYTES = 64 << 10  # small beside a COG block: a window's reads fetch little beyond its blocks
CACHED_CHUNKS = 128  # 8 MiB a file
READ_AHEAD_CHUNKS = 8  # at most 512 KiB fetched past what a sequential read asked for


@dataclass
class _Remote:
    """What one request has read of one URL."""
    size: int
    fetched: int = 0
    chunks: "OrderedDict[int, bytes]" = dataclasses.field(default_factory=OrderedDict)
    next_chunk: int = -1  # the chunk after the last fetch: a miss there is a sequential read
    read_ahead: int = 0   # chunks the next sequential miss fetches beyond what it asks for


@dataclass
class RemoteReads:
    """How one request reads its remote files: the fetch policy, the request field errors name, and
    what was read so far (per URL, shared by every open of the file in the request), and the request's
    kept-alive connections (never shared with another request)."""
    policy: FetchPolicy
    field: str
    files: Dict[str, _Remote] = dataclasses.field(default_factory=dict)
    connections: KeptConnections = dataclasses.field(default_factory=KeptConnections)

    def close(self) -> None:
        self.connections.close()


class RangeFile(io.RawIOBase):
    def __init__(self, url: str, reads: RemoteReads):
        super().__init__()
        self.url, self.reads = url, reads
        self.pos = 0
        known = reads.files.get(url)
        self.remote = known if known is not None else _Remote(size=-1)
        if known is None:
            first, size = self._get(0, 0)
            if size < 0:
                raise InputError(f"{reads.field}: the server did not say the file's size (Content-Range); it must "
                                 "answer HTTP range requests", param=reads.field)
            self.remote.size = size
            self._keep(0, first)
            reads.files[url] = self.remote
        self.size = self.remote.size

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
        """Cached chunks from the cache, each run of missing ones by one range request."""
        view = memoryview(buffer).cast("B")
        end = min(self.pos + len(view), self.size)
        chunks, done = self.remote.chunks, 0
        index, last = self.pos // CHUNK_BYTES, (end - 1) // CHUNK_BYTES
        while self.pos < end and index <= last:
            if index in chunks:
                chunks.move_to_end(index)
                data, stop = chunks[index], index
            else:
                stop = index
                while stop < last and stop + 1 not in chunks:
                    stop += 1
                stop = self._read_ahead(index, stop)
                data, _ = self._get(index, stop)
                for i in range(index, stop + 1):
                    self._keep(i, data[(i - index) * CHUNK_BYTES:(i - index + 1) * CHUNK_BYTES])
            piece = data[self.pos - index * CHUNK_BYTES:end - index * CHUNK_BYTES]
            if not piece:
                break
            view[done:done + len(piece)] = piece
            done += len(piece)
            self.pos += len(piece)
            index = stop + 1
        return done

    def _read_ahead(self, first: int, stop: int) -> int:
        """The last chunk to fetch for a miss of first..stop. GDAL reads a COG's blocks one call each, in
        file order along a row of blocks: a miss right after the last fetch fetches 1, 2, 4, ... up to
        READ_AHEAD_CHUNKS more chunks (as GDAL's /vsicurl/ grows its reads), so a row costs a few GETs
        instead of one a block; any other miss fetches only what it asked for and starts over."""
        remote = self.remote
        sequential = first == remote.next_chunk
        remote.read_ahead = min(max(1, 2 * remote.read_ahead), READ_AHEAD_CHUNKS) if sequential else 0
        final = (remote.size - 1) // CHUNK_BYTES
        for _ in range(remote.read_ahead):
            if stop >= final or stop + 1 in remote.chunks:
                break
            stop += 1
        remote.next_chunk = stop + 1
        return stop

    def _get(self, first: int, last: int):
        """Chunks first..last in one request (a range past the end is clipped by the server, RFC 9110)."""
        reads = self.reads
        data, size = fetch_range(self.url, first * CHUNK_BYTES, (last + 1) * CHUNK_BYTES - 1, reads.policy,
                                 reads.field, connections=reads.connections)
        self.remote.fetched += len(data)
        if self.remote.fetched > reads.policy.max_bytes:
            raise InputError(f"{reads.field}: reading the scene took more than {reads.policy.max_bytes} bytes "
                             "from its host; the limit is server.limits.max_media_bytes", param=reads.field)
        return data, size

    def _keep(self, index: int, data: bytes) -> None:
        chunks = self.remote.chunks
        chunks[index] = data
        while len(chunks) > CACHED_CHUNKS:
            chunks.popitem(last=False)


def opener_for(url: str, reads: RemoteReads, errors: List[InputError]) -> Callable:
    """rasterio's `opener`: the scene's URL opens as a RangeFile; any other name GDAL asks for is missing.
    GDAL turns an exception in the opener into its own terse error: the fetcher's InputError (which says
    what was refused and why) is kept in `errors` for the caller to raise instead."""
    def opener(path: str, mode: str = "rb"):
        if path != url or "w" in mode or "+" in mode:
            raise FileNotFoundError(path)
        try:
            return RangeFile(url, reads)
        except InputError as e:
            errors.append(e)
            raise
    return opener
