"""vLLM's `/pooling` body for GeoTIFF models, as its IO-processor plugins take it (terratorch's
`terratorch_segmentation`), so their clients can point at us unchanged:

    {"model"?, "data": {"data": <base64 | URL | path>, "data_format": "b64_json" | "url" | "path",
                        "out_data_format": "b64_json" | "path", "image_format"?: "tiff",
                        "indices"?: [0-based band indexes]},
     "priority"?: 0, "task"?: "plugin"}
    -> {"request_id", "created_at", "data": {"data_format", "data", "request_id"}}

Ours, inside `data` where vLLM's plugin takes its input: `data` may also be a list of per-band files
(URLs or allowed paths, in the model's band order), and `aoi` ([xmin, ymin, xmax, ymax]) with
`aoi_crs` limits the run to that box, and `date` gives the acquisition date, as `appliance run`'s
`input=[[...]]`, `aoi`, `aoi_crs` and `date` do
(their rules are the CLI's own: `stages/geo/sources.scene_spec`, `stages/geo/aoi.parse_aoi`). For a
multi-date model (T = `model.prithvi.num_frames` > 1) a list in `data` is its T dates in time order (URLs,
STAC items, allowed paths or base64 GeoTIFFs) and one entry a stacked file, and `date` a list of T dates
(`stages/geo/multidate.py`): `parse_pooling(body, frames)` applies the shape rules that depend on T.

`PoolingBody` is the one definition of the request: it validates bodies (strict: no type coercion,
no unknown field) and the server's OpenAPI document is generated from it (`serving/http/openapi.py`).
`PoolingResponse` describes the answer (`pooling_response` builds it as a plain dict), for the same
document and for the tests that check real answers against it.
"""
import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from appliance.errors import InputError
from appliance.protocol.openai_fields import Integral, JsonSchema, OneOrList
from appliance.protocol.validation import input_error


MAX_BAND_FILES = 64  # a list of per-band files or of dates (here and in scenes.py): more than any model has


URL = r"^([Hh][Tt][Tt][Pp][Ss]?|[Ss]3)://"  # data_format url: http(s), or s3://bucket/key (any case)
URL_TEXT: JsonSchema = {"type": "string", "pattern": URL}
NonEmptyText = Annotated[str, Field(min_length=1)]
# an acquisition date, or a multi-date model's list of them (stages/geo/multidate.given_dates checks them)
Dates = OneOrList[str, Annotated[List[str], Field(min_length=1, max_length=MAX_BAND_FILES)]]


class PoolingData(BaseModel):
    # `parse_pooling`'s URL rule, for the document
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"properties": {"data_format": {"enum": ["b64_json", "path"]}}},
        {"properties": {"data": {"anyOf": [URL_TEXT, {"type": "array", "items": URL_TEXT}]}}}]})

    data: OneOrList[NonEmptyText, Annotated[List[NonEmptyText],
                                            Field(min_length=1, max_length=MAX_BAND_FILES)]] = Field(
        description="the GeoTIFF: base64, a URL (http(s), or s3:// where the server allows the bucket) or a file "
                    "name; or a list of single-band files (URLs or file names), one per model band in the model's "
                    "band order. A multi-date model (T dates): one stacked GeoTIFF of T x bands, or a list of its T "
                    "dates in time order, each a GeoTIFF (base64, URL or file name) or a STAC item URL")
    data_format: Literal["b64_json", "url", "path"]
    out_data_format: Literal["b64_json", "path"] = "b64_json"
    image_format: Optional[Literal["tiff", "tif", "geotiff"]] = "tiff"
    indices: Optional[List[Integral[Annotated[int, Field(ge=0)]]]] = Field(
        default=None, min_length=1, description="0-based file bands, in the model's band order")
    aoi: Optional[List[float]] = Field(default=None, description="area of interest [xmin, ymin, xmax, ymax], "
                                                                "lon/lat unless aoi_crs: the output is that window")
    aoi_crs: Optional[str] = Field(default=None, description="the aoi's CRS, e.g. EPSG:32615 (default EPSG:4326)")
    date: Optional[Dates] = Field(
        default=None, description="the scene's acquisition date, YYYY-MM-DD, for models with a time encoding (a "
                                  "multi-date model: a list of its T dates, in the order of the inputs); default: "
                                  "the source's own")


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
            "data.data": "a non-empty string (base64 GeoTIFF, URL or file name) or a list of per-band URLs or "
                         "file names",
            "data.indices": "a non-empty list of 0-based band indexes",
            "data.aoi": "[xmin, ymin, xmax, ymax] (numbers)",
            "data.aoi_crs": "a CRS name like EPSG:32615",
            "data.date": "a date YYYY-MM-DD, or a list of them (a multi-date model)"}


@dataclass
class PoolingRequest:
    data: Union[str, List[str], None]  # one GeoTIFF, or per-band files (a multi-date model: its dates)
    data_format: str
    out_data_format: str
    model: Optional[str] = None
    bands: Optional[List[int]] = None  # 1-based, for the raster_read stage
    aoi: Optional[List[float]] = None  # as sent: `stages/geo/aoi.parse_aoi` checks it (it needs GDAL's CRSs)
    aoi_crs: Optional[str] = None
    date: Union[str, List[str], None] = None  # as sent: `stages/geo/multidate.given_dates` checks it


def parse_pooling(body: Any, frames: int = 1) -> PoolingRequest:
    """The request for a server whose model takes `frames` dates per scene; InputError naming the field."""
    if not isinstance(body, dict):
        raise InputError(f"body: expected a JSON object, got {type(body).__name__}")
    try:
        parsed = PoolingBody.model_validate(body)
    except ValidationError as e:
        raise input_error(e, PoolingBody, EXPECTED) from None
    data = parsed.data
    files = data.data if isinstance(data.data, list) else [data.data]
    listed = isinstance(data.data, list)
    if listed and frames == 1 and data.data_format == "b64_json":
        raise InputError("data.data: a list of per-band files takes data_format url or path; send one multi-band "
                         "GeoTIFF as b64_json", param="data.data")
    if listed and frames == 1 and data.indices is not None:
        raise InputError("data.indices: picks bands of one multi-band file; a per-band list is already in the "
                         "model's band order: drop indices", param="data.indices")
    if not listed and frames > 1 and data.indices is not None:
        raise InputError(f"data.indices: picks bands of each date of a list; one file for this {frames}-date model "
                         "is a stacked file, read by its declared band order: drop indices", param="data.indices")
    if data.data_format == "url":
        for i, url in enumerate(files):
            field = f"data.data[{i}]" if listed and frames > 1 else "data.data"
            if not re.match(URL, url):
                raise InputError(f"{field}: expected an http(s) URL (or s3://bucket/key) with data_format url",
                                 param=field)
    bands = [i + 1 for i in data.indices] if data.indices is not None else None
    return PoolingRequest(data.data, data.data_format, data.out_data_format, parsed.model, bands, data.aoi,
                          data.aoi_crs, data.date)


class PoolingOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    data_format: Literal["b64_json", "path"] = Field(description="the request's out_data_format")
    data: str = Field(description="the output GeoTIFF, base64; or its file name in the server's output_dir")
    request_id: str


class PoolingResponse(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    request_id: str
    created_at: int
    data: PoolingOutput


def pooling_response(request_id: str, out_data_format: str, data: str) -> Dict[str, Any]:
    return {"request_id": request_id, "created_at": int(time.time()),
            "data": {"data_format": out_data_format, "data": data, "request_id": request_id}}
