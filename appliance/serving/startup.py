"""What `appliance serve` checks before it announces anything: settings that would only fail later (a
port in use, a media directory that is not there) end as a one-line error and exit 2 instead."""
import errno
import fcntl
import os
import socket
import tempfile
from contextlib import contextmanager
from typing import Iterator, Optional

from appliance.errors import ConfigError


@contextmanager
def claim_port(host: str, port: int) -> Iterator[None]:
    """Hold `host:port` for this server while it runs: a lock that a second `appliance serve` on the same
    address finds taken (two servers started together both see the port free: neither listens until its
    model is loaded), then the port itself checked free. A lock file that cannot be made (a read-only or
    foreign temp directory) leaves the check alone; the supervisor still checks that the process clients
    reach is its own before it says ready."""
    path = os.path.join(tempfile.gettempdir(), f"appliance-serve-{host.replace(':', '_')}-{port}.lock")
    try:
        lock = open(path, "a+")
    except OSError:
        lock = None
    try:
        if lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"server.port: another appliance server is starting or serving on {host}:{port}; "
                                  "stop it or pass server.port=N") from None
        check_port_free(host, port)
        yield
    finally:
        if lock is not None:
            lock.close()


def check_port_free(host: str, port: int) -> None:
    """Bind `host:port` once, as uvicorn will (SO_REUSEADDR), and let it go; ConfigError when that fails."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"server.host: cannot resolve {host!r} ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"server.port: {host}:{port} is already in use; stop what listens there or "
                                  f"pass server.port=N") from None
            raise ConfigError(f"server.host/server.port: cannot listen on {host}:{port} "
                              f"({e.strerror or e})") from None


def check_media_dir(path: Optional[str]) -> None:
    """`server.allowed_local_media_dir`, when set, is an existing directory."""
    if path is None or path == "":
        return
    if not os.path.exists(path):
        raise ConfigError(f"server.allowed_local_media_dir: {path} does not exist; create it or point the "
                          f"setting at the directory clients may name files in")
    if not os.path.isdir(path):
        raise ConfigError(f"server.allowed_local_media_dir: {path} is not a directory")


def url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def check_server_settings(cfg) -> None:
    """The `server.*` checks that need this host, made before a model loads (`appliance check` makes them
    too); each setting's own rule was checked at composition (field_rules.py), the port is claimed
    when the server starts (`claim_port`)."""
    check_media_dir(cfg.server.allowed_local_media_dir)
