"""vLLM's `/pooling` body for GeoTIFF models, as its IO-processor plugins take it (terratorch's
`terratorch_segmentation`), so their clients can point at us unchanged:

    {"model"?, "data": {"data": <base64 | URL | path>, "data_format": "b64_json" | "url" | "path",
                        "out_data_format": "b64_json" | "path", "image_format"?: "tiff",
                        "indices"?: [0-based band indexes]},
     "priority"?: 0, "task"?: "plugin"}
    -> {"request_id", "created_at", "data": {"data_format", "data", "request_id"}}
"""
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from appliance.errors import InputError

DATA_FORMATS = ("b64_json", "url", "path")
OUT_FORMATS = ("b64_json", "path")
TOP_FIELDS = ("model", "data", "priority", "task", "user", "request_id")
DATA_FIELDS = ("data", "data_format", "out_data_format", "image_format", "indices")


@dataclass
class PoolingRequest:
    data: str
    data_format: str
    out_data_format: str
    model: Optional[str] = None
    bands: Optional[List[int]] = None  # 1-based, for the raster_read stage


def _fail(field: str, message: str) -> InputError:
    return InputError(f"{field}: {message}", param=field)


def parse_pooling(body: Any) -> PoolingRequest:
    if not isinstance(body, dict):
        raise InputError(f"body: expected a JSON object, got {type(body).__name__}")
    for key in body:
        if key not in TOP_FIELDS:
            raise _fail(key, f"unknown field; allowed: {', '.join(TOP_FIELDS)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", f"expected a string, got {model!r}")
    if body.get("priority", 0) not in (0, None):
        raise _fail("priority", f"{body['priority']!r}; allowed: 0 (requests are served first come, first served)")
    if body.get("task", "plugin") not in ("plugin", None):
        raise _fail("task", f"{body['task']!r}; allowed: plugin")
    data = body.get("data")
    if not isinstance(data, dict):
        raise _fail("data", "required, an object {data, data_format, out_data_format}")
    for key in data:
        if key not in DATA_FIELDS:
            raise _fail(f"data.{key}", f"unknown field; allowed: {', '.join(DATA_FIELDS)}")
    fmt, out = data.get("data_format"), data.get("out_data_format", "b64_json")
    if fmt not in DATA_FORMATS:
        raise _fail("data.data_format", f"{fmt!r}; allowed: {', '.join(DATA_FORMATS)}")
    if out not in OUT_FORMATS:
        raise _fail("data.out_data_format", f"{out!r}; allowed: {', '.join(OUT_FORMATS)}")
    if data.get("image_format", "tiff") not in ("tiff", "tif", "geotiff", None):
        raise _fail("data.image_format", f"{data['image_format']!r}; allowed: tiff")
    value = data.get("data")
    if not isinstance(value, str) or not value:
        raise _fail("data.data", f"required, a non-empty string ({'base64 GeoTIFF' if fmt == 'b64_json' else fmt})")
    if fmt == "url" and not value.lower().startswith(("http://", "https://")):
        raise _fail("data.data", "expected an http(s) URL with data_format url")
    return PoolingRequest(value, fmt, out, model, _bands(data.get("indices")))


def _bands(indices: Any) -> Optional[List[int]]:
    if indices is None:
        return None
    if not isinstance(indices, list) or not indices or \
            not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
        raise _fail("data.indices", f"expected a non-empty list of 0-based band indexes, got {indices!r:.80}")
    return [i + 1 for i in indices]


def pooling_response(request_id: str, out_data_format: str, data: str) -> Dict[str, Any]:
    return {"request_id": request_id, "created_at": int(time.time()),
            "data": {"data_format": out_data_format, "data": data, "request_id": request_id}}
