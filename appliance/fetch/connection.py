"""HTTP(S) connections that talk to a host name over a socket to an address vetted beforehand.

http.client would resolve the host again inside `connect()`; these open the socket to the addresses
the caller already checked, while the Host header, TLS SNI and the certificate check still use the
host name (http.client sends `Host: <host>[:port]` from `self.host`).
"""
from __future__ import annotations

import http.client
import socket
import ssl
import time
from typing import Optional, Sequence, Union

from appliance.fetch.addresses import Address


def open_socket(addresses: Sequence[Address], timeout_s: float, deadline: float) -> socket.socket:
    """Connect to the first address that answers, each try within `timeout_s` and before `deadline`.
    Raises the last OSError (TimeoutError on a timeout) when none does."""
    error: OSError = TimeoutError("no time left to connect")
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(address.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(min(timeout_s, left))
            sock.connect(address.sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


class PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, addresses: Sequence[Address], connect_timeout_s: float,
                 deadline: float):
        super().__init__(host, port, timeout=connect_timeout_s)
        self.addresses, self.deadline = tuple(addresses), deadline
        self.connect_timeout_s = connect_timeout_s
        self.auto_open = 0  # never reconnect behind the caller's back: connect() is called once, by it
        self.reused = False  # True once it has served a response and been kept (kept_connections.py)

    def connect(self) -> None:
        self.sock = open_socket(self.addresses, self.connect_timeout_s, self.deadline)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, addresses: Sequence[Address], connect_timeout_s: float,
                 deadline: float, context: Optional[ssl.SSLContext] = None):
        context = context or ssl.create_default_context()  # verifies the chain and the host name
        super().__init__(host, port, timeout=connect_timeout_s, context=context)
        self.addresses, self.deadline, self.tls = tuple(addresses), deadline, context
        self.connect_timeout_s = connect_timeout_s
        self.auto_open = 0
        self.reused = False

    def connect(self) -> None:
        sock = open_socket(self.addresses, self.connect_timeout_s, self.deadline)
        try:  # the handshake runs under the connect timeout still set on the socket
            self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise


PinnedConnection = Union[PinnedHTTPConnection, PinnedHTTPSConnection]  # what a fetch opens, keeps and reuses
