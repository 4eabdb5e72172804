"""`Route`: one route of the API stated once, for both its uses: spec.py adds it to the app (path,
methods, handler), and openapi.py describes it from the same entry (what its body and its answer are).

A path may have one Route per method (each its own handler). A schema is a pydantic model, a tuple of models one of
which the body is (a text or a chat), or a plain
JSON schema (bytes: a GeoTIFF, a PNG). A streamed answer's schema is that of one event's data.
"""
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Tuple

JSON, SSE = "application/json", "text/event-stream"
BYTES = {"type": "string", "format": "binary"}
GET, POST = ("GET",), ("POST",)


@dataclass(frozen=True)
class Route:
    path: str                      # Starlette's form: a typed parameter is `{model_id:path}`
    methods: Tuple[str, ...]
    handler: Callable
    body: Dict[str, Any] = field(default_factory=dict)     # content type -> the body's schema
    answers: Dict[str, Any] = field(default_factory=dict)  # content type -> the 200 answer's schema
    query: Dict[str, Any] = field(default_factory=dict)    # query parameter -> its schema (all optional)
    params: Dict[str, Any] = field(default_factory=dict)   # path parameter -> its schema (default: a string)
    status: str = "200"            # the status of a success (a job accepted: 202)
    headers: Dict[str, str] = field(default_factory=dict)  # a success's headers -> what they say
    documented: bool = True        # False: no API (the pages' files): left out of /openapi.json

    @property
    def openapi_path(self) -> str:
        """The path as OpenAPI writes it: `{model_id:path}` -> `{model_id}`."""
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)
