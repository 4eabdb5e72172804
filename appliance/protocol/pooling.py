"""vLLM's `/pooling` body for GeoTIFF models, as its IO-processor plugins take it (terratorch's
`terratorch_segmentation`), so their clients can point at us unchanged:

    {"model"?, "data": {"data": <base64 | URL | path>, "data_format": "b64_json" | "url" | "path",
                        "out_data_format": "b64_json" | "path", "image_format"?: "tiff",
                        "indices"?: [0-based band indexes]},
     "priority"?: 0, "task"?: "plugin"}
    -> {"request_id", "created_at", "data": {"data_format", "data", "request_id"}}

`PoolingBody` is the one definition of the request: it validates bodies (strict: no type coercion,
no unknown field) and the server's OpenAPI document is generated from it (`serving/http/openapi.py`).
"""
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from appliance.errors import InputError
from appliance.protocol.validation import input_error


class PoolingData(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    data: str = Field(min_length=1, description="the GeoTIFF: base64, an http(s) URL or a file name")
    data_format: Literal["b64_json", "url", "path"]
    out_data_format: Literal["b64_json", "path"] = "b64_json"
    image_format: Optional[Literal["tiff", "tif", "geotiff"]] = "tiff"
    indices: Optional[List[Annotated[int, Field(ge=0)]]] = Field(
        default=None, min_length=1, description="0-based file bands, in the model's band order")


class PoolingBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    data: PoolingData
    model: Optional[str] = None
    priority: Optional[Literal[0]] = Field(default=0, description="0 only: requests are served first come, "
                                                                    "first served")
    task: Optional[Literal["plugin"]] = "plugin"
    user: Optional[str] = None
    request_id: Optional[str] = None
    softmax: Optional[bool] = Field(default=None, description="sent by vLLM's IO-processor clients; ignored, as "
                                                             "vLLM ignores it")


# What an error says a field should be, where pydantic's own words would not help a client.
EXPECTED = {"data": "an object {data, data_format, out_data_format}",
            "data.data": "a non-empty string (base64 GeoTIFF, http(s) URL or file name)",
            "data.indices": "a non-empty list of 0-based band indexes"}


@dataclass
class PoolingRequest:
    data: str
    data_format: str
    out_data_format: str
    model: Optional[str] = None
    bands: Optional[List[int]] = None  # 1-based, for the raster_read stage


def parse_pooling(body: Any) -> PoolingRequest:
    if not isinstance(body, dict):
        raise InputError(f"body: expected a JSON object, got {type(body).__name__}")
    try:
        parsed = PoolingBody.model_validate(body)
    except ValidationError as e:
        raise input_error(e, PoolingBody, EXPECTED) from None
    data = parsed.data
    if data.data_format == "url" and not data.data.lower().startswith(("http://", "https://")):
        raise InputError("data.data: expected an http(s) URL with data_format url", param="data.data")
    bands = [i + 1 for i in data.indices] if data.indices is not None else None
    return PoolingRequest(data.data, data.data_format, data.out_data_format, parsed.model, bands)


def pooling_response(request_id: str, out_data_format: str, data: str) -> Dict[str, Any]:
    return {"request_id": request_id, "created_at": int(time.time()),
            "data": {"data_format": out_data_format, "data": data, "request_id": request_id}}
