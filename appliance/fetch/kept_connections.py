"""`KeptConnections`: the kept-alive connections of one request's fetches, so a reader that makes hundreds
of range GETs to one host (a GeoTIFF read by windows) pays for one TCP (and TLS) handshake, not one each.

A pool belongs to one request and is closed when the request ends: nothing is shared between requests
or clients. A connection is filed under the (scheme, host name, port, TLS context) it was vetted and
opened for and is only handed out for exactly that key; the fetcher re-judges its addresses under the
caller's policy before reusing it (client.py), and every redirect hop is judged on its own. Only a
connection whose response was read to the end and that the server keeps open is filed. Thread-safe:
a connection is taken out while in use, so two threads never share one.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Hashable, Optional

from appliance.fetch.connection import PinnedConnection

MAX_IDLE_PER_HOST = 4  # one reader uses one; a few more if GDAL reads from several threads


class KeptConnections:
    def __init__(self, max_idle_per_host: int = MAX_IDLE_PER_HOST):
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[Hashable, list[PinnedConnection]] = defaultdict(list)
        self._lock = threading.Lock()
        self._closed = False

    def take(self, key: Hashable) -> Optional[PinnedConnection]:
        """An idle connection filed under `key` (most recently used first), or None."""
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def put(self, key: Hashable, connection: PinnedConnection) -> None:
        """File a connection whose last response was read to the end; closed instead when the pool is
        closed or already holds enough for `key`."""
        with self._lock:
            idle = self._idle[key]
            if not self._closed and len(idle) < self.max_idle_per_host:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        """Close every idle connection; later `put`s close theirs at once."""
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def __enter__(self) -> "KeptConnections":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
