"""`fetch_bytes` and `fetch_to_file`: one GET that follows redirects by hand, re-checking every hop.

Each hop: the scheme must be http or https; the host is resolved once and every address it resolves
to must be public (see addresses.py) unless the host is in `policy.allowed_domains`; the connection
goes to those vetted addresses. Timeouts: connect and each read on the socket, each also cut short
by the total deadline, which is checked between reads too. The byte cap is checked from
Content-Length before reading and while streaming (reading stops at max_bytes + 1).

With a `KeptConnections` (kept_connections.py: one request's), a hop whose (scheme, host, port) already has a kept
connection reuses it after its vetted addresses are judged again under this policy (no second lookup:
the socket is already connected to one of them); a kept connection the server closed while idle is
replaced by a fresh, fully checked one. Without a pool every hop opens its own connection and closes it.

Every failure is an InputError "<field>: <host> ...: what was wrong; what is allowed". Messages
name the host (and port), never the URL's path, query string or userinfo.
"""
from __future__ import annotations

import http.client
import os
import socket
import ssl
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import BinaryIO, Callable, Literal, NoReturn, Optional, Sequence, Union, overload

from appliance.errors import InputError
from appliance.fetch.addresses import Address, first_refused, resolve
from appliance.fetch.connection import PinnedConnection, PinnedHTTPConnection, PinnedHTTPSConnection
from appliance.fetch.policy import FetchPolicy
from appliance.fetch.kept_connections import KeptConnections

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
RECV_BYTES = 1 << 16
HEADERS = {"User-Agent": "appliance-fetch", "Accept-Encoding": "identity", "Connection": "close"}
KEEP_ALIVE_HEADERS = {k: v for k, v in HEADERS.items() if k != "Connection"}  # HTTP/1.1's default: kept
# A kept connection the server closed while it sat idle fails like this before any answer: retried once,
# on a fresh connection (a GET is safe to repeat).
STALE_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)

# fetch_bytes's shape; image loading takes one of these so tests can stand in for the network.
Fetcher = Callable[[str, FetchPolicy, str], bytes]


def fetch_bytes(url: str, policy: FetchPolicy, field: str, *, ssl_context: Optional[ssl.SSLContext] = None,
                connections: Optional[KeptConnections] = None) -> bytes:
    """The body of `url` (at most policy.max_bytes of it), or an InputError naming `field`."""
    chunks: list[bytes] = []
    _Transfer(url, policy, field, ssl_context, connections=connections).run(chunks.append)
    return b"".join(chunks)


def fetch_range(url: str, start: int, end: int, policy: FetchPolicy, field: str, *,
                ssl_context: Optional[ssl.SSLContext] = None,
                connections: Optional[KeptConnections] = None) -> tuple[bytes, int]:
    """Bytes `start..end` (inclusive) of `url` and the file's total size (from Content-Range), by one
    ranged GET under the same rules; a host that does not answer 206 is an InputError. For readers that
    take a file a window at a time (GeoTIFFs, appliance/stages/geo/remote_file.py), which pass the
    request's `connections` so their GETs share kept-alive connections."""
    chunks: list[bytes] = []
    transfer = _Transfer(url, policy, field, ssl_context, byte_range=(start, end), connections=connections)
    transfer.run(chunks.append)
    return b"".join(chunks), transfer.total_size


def fetch_to_file(url: str, path: Union[str, os.PathLike, BinaryIO], policy: FetchPolicy, field: str, *,
                  ssl_context: Optional[ssl.SSLContext] = None) -> int:
    """Stream `url` into `path` and return the bytes written. On failure nothing is left behind.

    A path is written through a temporary file beside it and renamed into place, so a failure leaves
    whatever was at `path` before (usually nothing). An open binary file is truncated back to where it
    stood. Errors writing locally (disk full, no such directory) stay OSError: they are not the URL's.
    """
    transfer = _Transfer(url, policy, field, ssl_context)
    if not isinstance(path, (str, os.PathLike)):  # an open binary file
        start = path.tell()
        try:
            return transfer.run(path.write)
        except BaseException:
            path.seek(start)
            path.truncate()
            raise
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.part")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode 0o666 minus the umask
    try:
        with os.fdopen(fd, "wb") as f:
            written = transfer.run(f.write)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    return written


@dataclass(frozen=True)
class _Hop:
    """One request of the chain: where it goes and how messages name it."""
    scheme: str
    host: str
    port: int
    path: str   # path and query, sent on the request line only
    where: str  # "media.example.com" or "10.1.2.3:8080 (redirected from media.example.com)"

    def pool_key(self, ssl_context: Optional[ssl.SSLContext]) -> tuple:
        """What a kept connection must match exactly to serve this hop."""
        return self.scheme, self.host, self.port, ssl_context


class _Transfer:
    """One fetch: the policy, the field for messages, and the deadline shared by every hop."""

    def __init__(self, url: str, policy: FetchPolicy, field: str, ssl_context: Optional[ssl.SSLContext],
                 byte_range: Optional[tuple[int, int]] = None, connections: Optional[KeptConnections] = None):
        self.url, self.policy, self.field, self.ssl_context = url, policy, field, ssl_context
        self.connections = connections
        self.deadline = time.monotonic() + policy.total_timeout_s
        self.byte_range = byte_range  # (start, end) inclusive: a ranged GET that must answer 206
        self.total_size = -1  # the whole file's size, from a 206's Content-Range

    def run(self, write: Callable[[bytes], object]) -> int:
        url, origin = self.url, None
        for _ in range(self.policy.max_redirects + 1):
            hop = self._hop(url, origin)
            connection, response = self._reused(hop), None
            if connection is None:
                connection = self._connect(hop)
            sock, kept = connection.sock, False  # http.client drops .sock once a closing response starts
            try:
                response = self._get(connection, sock, hop, reused=connection.reused)
                if response is None:  # the kept connection had been closed by the server
                    connection.close()
                    connection = self._connect(hop)
                    sock = connection.sock
                    response = self._get(connection, sock, hop, reused=False)
                if response.status not in REDIRECT_STATUSES:
                    written = self._stream(sock, response, hop, write)
                    kept = self._keep(connection, response, hop)
                    return written
                url, origin = self._redirect_target(response, url, hop), origin or hop.where
            finally:  # all three, so the socket really closes now and the server sees us stop reading
                if not kept:
                    if response is not None:
                        response.close()
                    connection.close()
                    sock.close()
        self._fail(f"{origin} redirected more than {self.policy.max_redirects} times; "
                   f"at most {self.policy.max_redirects} redirects are followed")

    # --- one hop -----------------------------------------------------------------------------

    def _hop(self, url: str, origin: Optional[str]) -> _Hop:
        redirected = f" (redirected from {origin})" if origin else ""
        try:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            self._fail(f"not a valid URL{redirected}; give an http:// or https:// URL with a host name and "
                       "an optional numeric port")
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            shown = f"{scheme}:" if scheme else "scheme-less"
            where = f"a redirect from {origin} led to a {shown} URL" if origin else \
                f"unsupported URL scheme {scheme or 'missing'!r}" + (f" (host {host})" if host else "")
            self._fail(f"{where}; only http:// and https:// URLs are fetched")
        if not host:
            self._fail(f"URL has no host{redirected}; give an http:// or https:// URL with a host name")
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")  # the Host header and DNS take the ASCII form
            except UnicodeError:
                self._fail(f"host {host!r}{redirected} is not a valid host name")
        default_port = 443 if scheme == "https" else 80
        port = port or default_port
        shown_host = f"[{host}]" if ":" in host else host
        label = shown_host if port == default_port else f"{shown_host}:{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return _Hop(scheme, host, port, path, label + redirected)

    def _reused(self, hop: _Hop) -> Optional[PinnedConnection]:
        """A kept connection for exactly this hop's scheme, host, port and TLS context, its addresses
        judged again under this transfer's policy; None when the pool has none."""
        if self.connections is None:
            return None
        connection = self.connections.take(hop.pool_key(self.ssl_context))
        if connection is not None:
            try:
                self._check_deadline(hop)
                self._vet(hop, connection.addresses)
            except BaseException:
                connection.close()
                raise
        return connection

    def _keep(self, connection: PinnedConnection, response: http.client.HTTPResponse,
              hop: _Hop) -> bool:
        """File the connection in the pool when its response was read to the end and the server keeps it."""
        read_to_the_end = response.isclosed() or response.length == 0  # read1 leaves a spent response open
        if self.connections is None or response.will_close or not read_to_the_end:
            return False
        response.close()  # http.client sends the next request only once the last response is closed
        connection.reused = True
        self.connections.put(hop.pool_key(self.ssl_context), connection)
        return True

    def _vet(self, hop: _Hop, addresses: Sequence[Address]) -> None:
        if not self.policy.allows(hop.host):
            refused = first_refused(addresses)
            if refused is not None:
                ip, reason = refused
                self._fail(f"host {hop.where} resolves to {ip}, {reason}; only public addresses are fetched "
                           "(an operator can allow this host with server.allowed_media_domains)")

    def _connect(self, hop: _Hop) -> PinnedConnection:
        self._check_deadline(hop)
        try:
            addresses = resolve(hop.host, hop.port)
        except (socket.gaierror, ValueError) as e:  # ValueError: UnicodeError, NUL in the name
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            self._fail(f"could not resolve host {hop.where} ({reason}); the host needs a DNS name the server "
                       "can resolve")
        self._vet(hop, addresses)
        timeout = self.policy.connect_timeout_s
        connection: PinnedConnection
        if hop.scheme == "https":
            connection = PinnedHTTPSConnection(hop.host, hop.port, addresses, timeout, self.deadline,
                                               self.ssl_context)
        else:
            connection = PinnedHTTPConnection(hop.host, hop.port, addresses, timeout, self.deadline)
        try:
            connection.connect()
        except TimeoutError:
            connection.close()
            self._timed_out(hop, "connecting to", self.policy.connect_timeout_s)
        except ssl.SSLCertVerificationError as e:
            connection.close()
            self._fail(f"TLS certificate check failed for {hop.where} ({e.verify_message or e.reason}); "
                       "the host needs a valid certificate for its name")
        except OSError as e:
            connection.close()
            self._fail(f"could not connect to {hop.where} ({e.strerror or e.__class__.__name__}); the host must "
                       "accept http(s) connections from the server")
        return connection

    @overload
    def _get(self, connection: PinnedConnection, sock: socket.socket, hop: _Hop,
             reused: Literal[False]) -> http.client.HTTPResponse: ...

    @overload
    def _get(self, connection: PinnedConnection, sock: socket.socket, hop: _Hop,
             reused: bool) -> Optional[http.client.HTTPResponse]: ...

    def _get(self, connection: PinnedConnection, sock: socket.socket, hop: _Hop,
             reused: bool) -> Optional[http.client.HTTPResponse]:
        """The response's status and headers; None when a reused connection turns out closed by the
        server (the caller retries once on a fresh one)."""
        try:
            self._set_read_timeout(sock, hop)
            headers = HEADERS if self.connections is None else KEEP_ALIVE_HEADERS
            if self.byte_range is not None:
                headers = {**headers, "Range": "bytes=%d-%d" % self.byte_range}
            connection.request("GET", hop.path, headers=headers)
            return connection.getresponse()
        except STALE_ERRORS as e:
            if reused:
                return None
            self._no_valid_response(hop, e)
        except (http.client.InvalidURL, UnicodeError):
            self._fail(f"the URL for {hop.where} holds characters that cannot be sent (spaces, control or "
                       "non-ASCII characters); percent-encode them")
        except TimeoutError:
            self._timed_out(hop, "waiting for the response from", self.policy.read_timeout_s)
        except (http.client.HTTPException, OSError) as e:
            self._no_valid_response(hop, e)

    def _redirect_target(self, response: http.client.HTTPResponse, url: str, hop: _Hop) -> str:
        location = response.getheader("Location")
        if not location:
            self._fail(f"{hop.where} answered HTTP {response.status} without a Location; "
                       "the URL must answer 200 with the file")
        return urllib.parse.urljoin(url, location.strip())

    def _stream(self, sock: socket.socket, response: http.client.HTTPResponse, hop: _Hop,
                write: Callable[[bytes], object]) -> int:
        limit = self.policy.max_bytes
        if self.byte_range is not None:
            if response.status != 206:
                self._fail(f"{hop.where} answered HTTP {response.status} to a range request; the URL must answer "
                           "206 with the bytes asked for (a server that supports HTTP range requests)")
            whole = (response.getheader("Content-Range") or "").rpartition("/")[2]
            self.total_size = int(whole) if whole.isdigit() else -1
        elif response.status != 200:
            self._fail(f"{hop.where} answered HTTP {response.status}; the URL must answer 200 with the file")
        declared = response.length  # from Content-Length; None when chunked or absent
        if declared is not None and declared > limit:
            self._fail(f"{hop.where} sends {declared} bytes; the limit is {limit} bytes")
        total = 0
        while True:
            chunk = self._read(sock, response, hop, min(RECV_BYTES, limit + 1 - total), total)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                self._fail(f"{hop.where} sent more than {limit} bytes; the limit is {limit} bytes")
            write(chunk)  # a local write error stays an OSError: it is not the URL's fault
        if declared is not None and total != declared:
            self._fail(f"{hop.where} closed the connection after {total} of {declared} bytes; "
                       "the host must send the whole file")
        return total

    def _read(self, sock: socket.socket, response: http.client.HTTPResponse, hop: _Hop, size: int,
              so_far: int) -> bytes:
        """At most `size` bytes from one socket read (read1: a slow drip cannot hold up the deadline check)."""
        self._set_read_timeout(sock, hop)
        try:
            return response.read1(size)
        except TimeoutError:
            self._timed_out(hop, "reading the body from", self.policy.read_timeout_s)
        except (http.client.HTTPException, OSError) as e:
            self._fail(f"{hop.where} broke off the response after {so_far} bytes ({type(e).__name__}); "
                       "the host must send the whole file")

    # --- time and errors ---------------------------------------------------------------------

    def _set_read_timeout(self, sock: socket.socket, hop: _Hop) -> None:
        """Each read waits read_timeout_s at most, and never past the deadline (checked here too)."""
        sock.settimeout(min(self.policy.read_timeout_s, self._check_deadline(hop)))

    def _check_deadline(self, hop: _Hop) -> float:
        """Seconds left before the total deadline; an InputError once it has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._too_slow(hop)
        return left

    def _timed_out(self, hop: _Hop, doing: str, limit_s: float) -> NoReturn:
        if self.deadline - time.monotonic() < 0.05:  # the socket waited until the deadline, not limit_s
            self._too_slow(hop)
        self._fail(f"{doing} {hop.where} timed out after {limit_s:g} s; the host must answer within "
                   f"{limit_s:g} s (or send the data inline)")

    def _no_valid_response(self, hop: _Hop, error: Exception) -> NoReturn:
        self._fail(f"{hop.where} did not send a valid HTTP response ({type(error).__name__}); the URL must "
                   "answer an HTTP GET")

    def _too_slow(self, hop: _Hop) -> NoReturn:
        total = self.policy.total_timeout_s
        self._fail(f"fetching from {hop.where} took longer than {total:g} s; the whole transfer must finish "
                   f"within {total:g} s (server.limits.fetch_timeout_s)")

    def _fail(self, what: str) -> NoReturn:
        raise InputError(f"{self.field}: {what}", param=self.field)
