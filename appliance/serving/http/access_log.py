"""The request log: one INFO line per request, written by the Gate once the answer ended (a stream's
too), on the `appliance.access` logger; `server.access_log: false` turns it off. Polls (`GET /health`,
`/ready`, `/metrics`: probes, Prometheus, an open page every few seconds) are DEBUG lines, so the INFO
log shows the requests people made.

The line holds the method, the path (never the query string, headers or body: no API key or prompt
reaches the log), the status, the duration and the request id; routes add what they know through the
ASGI scope's state (`request.state`): the id they answer with, prompt and completion tokens, tiles.
A request no route named gets an id here.
"""
import logging
import time
from typing import Any, Dict

from appliance.protocol.openai_responses import new_id

LOGGER = "appliance.access"
HEAD = ("method", "path", "status", "duration_ms")  # the line's first words, unnamed
COUNTS = ("prompt_tokens", "completion_tokens", "tiles")  # what routes may put in the scope's state
POLLS = ("/health", "/ready", "/metrics")  # asked again and again by probes and pages: DEBUG lines


class AccessLog:
    def __init__(self):
        self.log = logging.getLogger(LOGGER)

    def write(self, scope, status: int, began: float) -> None:
        """`began`: time.perf_counter() when the request arrived."""
        level = logging.DEBUG if scope["method"] in ("GET", "HEAD") and scope["path"] in POLLS else logging.INFO
        if not self.log.isEnabledFor(level):
            return
        state = scope.get("state") or {}
        fields: Dict[str, Any] = {"method": scope["method"], "path": printable(scope["path"]), "status": status,
                                  "duration_ms": round((time.perf_counter() - began) * 1e3, 1),
                                  "request_id": state.get("request_id") or new_id("req")}
        for key in COUNTS:
            value = state.get(key)
            if value is not None:
                fields[key] = value
        client = scope.get("client")
        if client:
            fields["client"] = client[0]
        self.log.log(level, request_line(fields), extra={"fields": fields})


def request_line(fields: Dict[str, Any]) -> str:
    """`POST /v1/chat/completions 200 153.2 ms request_id=chatcmpl-... prompt_tokens=12 ...`"""
    head = f"{fields['method']} {fields['path']} {fields['status']} {fields['duration_ms']:.1f} ms"
    return " ".join([head, *(f"{key}={value}" for key, value in fields.items() if key not in HEAD)])


def printable(path: str) -> str:
    """The path as one line: ASGI hands it percent-decoded, and a `%0A` must not start a forged line."""
    return path if path.isprintable() else path.encode("unicode_escape").decode("ascii")
