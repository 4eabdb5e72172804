"""`FetchPolicy`: what a URL fetch may reach and how long and how much it may take."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from appliance.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class FetchPolicy:
    # Hosts (exact name or IP literal, any case) that may resolve to addresses otherwise refused:
    # an internal bucket, or 127.0.0.1 in tests. Matching is by the URL's host name, never by address.
    allowed_domains: tuple[str, ...] = ()
    connect_timeout_s: float = 5
    read_timeout_s: float = 10    # each socket read
    # The whole transfer (redirects included) and the body's bytes: server.limits.fetch_timeout_s and
    # max_media_bytes, given by the caller, so that no second default can disagree with the schema's.
    total_timeout_s: float
    max_bytes: int
    max_redirects: int = 5

    def __post_init__(self):
        if isinstance(self.allowed_domains, (str, bytes)):
            raise ConfigError(f"allowed_domains (server.allowed_media_domains): expected a list of host names, "
                              f"got the string {self.allowed_domains!r}; write [{self.allowed_domains!r}]")
        object.__setattr__(self, "allowed_domains", tuple(_bare_host(d) for d in self.allowed_domains))
        for name, shown in (("connect_timeout_s", "connect_timeout_s"), ("read_timeout_s", "read_timeout_s"),
                            ("total_timeout_s", "total_timeout_s (server.limits.fetch_timeout_s)")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{shown}: must be a number of seconds > 0, got {value!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ConfigError(f"max_bytes (server.limits.max_media_bytes): must be an integer >= 1, "
                              f"got {self.max_bytes!r}")
        if isinstance(self.max_redirects, bool) or not isinstance(self.max_redirects, int) or self.max_redirects < 0:
            raise ConfigError(f"max_redirects: must be an integer >= 0, got {self.max_redirects!r}")

    def allows(self, host: str) -> bool:
        """True when `host` is listed in `allowed_domains` (so its addresses are not checked)."""
        return normalize_host(host) in self.allowed_domains

    @classmethod
    def from_server_config(cls, server_cfg: Any) -> "FetchPolicy":
        """The policy the server and the offline CLI share: `server.allowed_media_domains`,
        `server.limits.max_media_bytes` and `server.limits.fetch_timeout_s` (the total time) of the
        composed config (a ServerConfig or its node), where the schema has given every key its value."""
        limits = _get(server_cfg, "limits")
        domains: Any = _get(server_cfg, "allowed_media_domains") or ()  # checked by __post_init__
        if not isinstance(domains, (str, bytes)):
            domains = tuple(domains)  # OmegaConf ListConfig, list or tuple
        return cls(allowed_domains=domains,
                   total_timeout_s=_get(limits, "fetch_timeout_s"),
                   max_bytes=_get(limits, "max_media_bytes"))


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets: the form hosts are compared in."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def _bare_host(entry: Any) -> str:
    if not isinstance(entry, str) or not normalize_host(entry):
        raise ConfigError(f"allowed_domains (server.allowed_media_domains): entry {entry!r} is not a host name; "
                          "give bare names like media.example.com or IP literals like 127.0.0.1")
    host = normalize_host(entry)
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if any(c in host for c in "/:@?# ") or "*" in host:
        raise ConfigError(f"allowed_domains (server.allowed_media_domains): entry {entry!r} is not a bare host; "
                          "give an exact host name like media.example.com (no scheme, port, path or wildcard)")
    return host


def _get(node: Any, key: str) -> Any:
    """node[key] for dicts and OmegaConf nodes, node.key for dataclasses; None when missing."""
    if node is None:
        return None
    if hasattr(node, "get"):
        return node.get(key)
    return getattr(node, key, None)
