"""`/v1/scenes`: scene jobs of pooling servers (serving/http/routes_scenes.py).

    POST /v1/scenes[?date=]  <GeoTIFF bytes> | {"url": "<GeoTIFF or STAC item URL>", "date"?}  -> 202, a Scene
                             (a multi-date model: {"urls": [date 1, ..., date T], "date"?: [T dates]}, or a
                             multipart/form-data form: T parts `files`, `date`?=d1,...,dT)
    GET  /v1/scenes                                                            -> a SceneList
    GET  /v1/scenes/{id}                                                       -> a Scene
    GET  /v1/scenes/{id}/{file}   mask.tif | item.json | scene.png | mask.png  -> the file
    GET  /v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png   mask | scene         -> a 256-px Web Mercator tile
    GET  /v1/scenes/{id}/tiles/{layer}/tilejson.json                          -> a TileJSON
    DELETE /v1/scenes/{id}                                                     -> a SceneDeleted

`SceneBody` validates the JSON body (strict, no unknown field) and is its schema in `/openapi.json`; the
answer models describe what the routes send as plain dicts (no model is built per request), as
`openai_answers` does: always-sent fields required, unknown fields refused, so tests that validate real
answers with them catch a drift either way. `SceneSummary` is what the engine process computes from the
written mask (stages/geo/scene_report.py) and the HTTP side passes on as it is.
"""
from typing import Any, List, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from appliance.errors import InputError
from appliance.protocol.openai_answers import ANSWER, Byte, Count, ErrorInfo
from appliance.protocol.pooling import MAX_BAND_FILES, Dates, NonEmptyText
from appliance.protocol.validation import input_error

SceneFile = Literal["mask.tif", "item.json", "scene.png", "mask.png"]  # a done scene's files, by public name
SCENE_FILES = get_args(SceneFile)
TILE_LAYERS = ("mask", "scene")  # a done scene's map tiles: the classes, the input's RGB (stages/geo/map_tiles.py)
Status = Literal["queued", "running", "done", "failed"]
Colour = Annotated[List[Byte], Field(min_length=3, max_length=3, description="RGB")]
Box = Annotated[List[float], Field(min_length=4, max_length=4)]


class SceneBody(BaseModel):
    """`POST /v1/scenes` as JSON (the other form is the GeoTIFF itself as the body)."""
    # `parse_scene_body`'s rule, for the document: url or urls, one of them
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"oneOf": [
        {"properties": {"url": {"type": "string"}, "urls": {"type": "null"}}, "required": ["url"]},
        {"properties": {"urls": {"type": "array"}, "url": {"type": "null"}}, "required": ["urls"]}]})

    url: Optional[NonEmptyText] = Field(
        default=None,
        description="a GeoTIFF or a STAC item: http(s), or s3:// where the server allows the bucket; read by "
                    "windows, never downloaded whole. A multi-date model: one stacked GeoTIFF of its T dates")
    urls: Optional[Annotated[List[NonEmptyText], Field(min_length=1, max_length=MAX_BAND_FILES)]] = Field(
        default=None, description="a multi-date model's T dates in time order, each a GeoTIFF or STAC item URL "
                                  "(instead of url)")
    date: Optional[Dates] = Field(
        default=None, description="the scene's acquisition date, YYYY-MM-DD, for models with a time encoding (a "
                                  "multi-date model: a list of its T dates, in order); default: the source's own")


class OneDateSceneBody(SceneBody):
    """SceneBody as a one-date model's server documents it: the scene by `url` alone (`parse_scene_body`,
    given frames=1, refuses `urls` naming it)."""
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"required": ["url"], "allOf": [
        {"properties": {"url": {"type": "string"}, "urls": {"type": "null"}}}]})


EXPECTED = {"url": "a GeoTIFF or STAC item URL (http(s), or s3://bucket/key)",
            "urls": "a list of GeoTIFF or STAC item URLs, one per date",
            "date": "a date YYYY-MM-DD, or a list of them (a multi-date model)"}


def parse_scene_body(body: Any, frames: int = 1) -> SceneBody:
    """A JSON `POST /v1/scenes` for a model of `frames` dates: `url`, or (frames > 1) `urls`; its `date` as
    sent (`stages/geo/multidate.given_dates` checks it, as `/pooling`'s); InputError naming the field."""
    if not isinstance(body, dict):
        raise InputError(f'body: expected a JSON object {{"url": ...}}, got {type(body).__name__}')
    try:
        parsed = SceneBody.model_validate(body)
    except ValidationError as e:
        raise input_error(e, SceneBody, EXPECTED) from None
    if parsed.urls is not None and frames == 1:
        raise InputError("urls: lists the dates of a multi-date model; this model takes one date: give "
                         '{"url": ...}', param="urls")
    if (parsed.url is None) == (parsed.urls is None):
        given = "both" if parsed.url is not None else "neither"
        dates = f', or {{"urls": [...]}} with its {frames} dates' if frames > 1 else ""
        raise InputError(f'url: {given} of url and urls given; give {{"url": ...}}{dates}', param="url")
    return parsed


# ---- the summary of a done scene ---------------------------------------------------------------

class SceneClass(BaseModel):
    model_config = ANSWER
    index: Count = Field(description="the class's value in mask.tif and mask.png")
    name: str
    colour: Colour
    pixels: Count
    area_km2: Optional[float] = Field(description="null for a rotated geographic grid")
    share: float = Field(description="pixels / valid_pixels (0.0 when nothing is valid)")


class LonLatGrid(BaseModel):
    model_config = ANSWER
    size: Annotated[int, Field(ge=2)] = Field(description="n: the grid is n x n points")
    lon: List[List[float]] = Field(description="[i][j]: at row i*height/(n-1), column j*width/(n-1)")
    lat: List[List[float]]


class PreviewSize(BaseModel):
    model_config = ANSWER
    width: Count
    height: Count


class SceneSummary(BaseModel):
    """Computed from the written mask at full resolution, in the engine process."""
    model_config = ANSWER
    width: Count = Field(description="the mask's size in pixels")
    height: Count
    crs: Optional[str] = Field(description="e.g. EPSG:32633")
    transform: Annotated[List[float], Field(min_length=6, max_length=6)] = Field(
        description="[a, b, c, d, e, f]: x = a*col + b*row + c, y = d*col + e*row + f")
    bounds: Box = Field(description="[left, bottom, right, top] in crs")
    lonlat_bounds: Optional[Box] = Field(description="[west, south, east, north]")
    lonlat_grid: Optional[LonLatGrid] = Field(description="lon/lat at n x n points of the pixel grid's corners, "
                                                          "for bilinear placement on a map")
    classes: List[SceneClass]
    valid_pixels: Count
    nodata_pixels: Count
    nodata_colour: Colour
    pixel_area_m2: Optional[float] = Field(description="null in a geographic CRS")
    preview: PreviewSize = Field(description="the size of scene.png and mask.png")
    acquisition_date: Optional[str] = Field(description="the scene's acquisition date (YYYY-MM-DD) as the mask's "
                                                        "tags record it; null when none was found")
    acquisition_date_source: Optional[str] = Field(description="where that date came from: date given, STAC "
                                                               "datetime, a date tag, file name")


# ---- the scene object and the list -------------------------------------------------------------

class Scene(BaseModel):
    model_config = ANSWER
    id: str
    object: Literal["scene"]
    created: int = Field(description="Unix time the scene was posted")
    status: Status = Field(description="queued, running (a preparer took it), done or failed")
    tiles_done: Count
    tiles_total: Optional[Count] = Field(description="null until the scene is opened and its tiles planned")
    error: Optional[ErrorInfo] = Field(description="failed: why, as an error answer says it")
    result: Optional[SceneSummary] = Field(description="done: the summary")
    files: List[SceneFile] = Field(description="done: the files GET /v1/scenes/{id}/{file} answers")


class TileJSON(BaseModel):
    """TileJSON 3.0.0 (github.com/mapbox/tilejson-spec) of one layer of a done scene's tiles."""
    model_config = ANSWER
    tilejson: Literal["3.0.0"]
    name: str = Field(description="the scene's id and the layer")
    scheme: Literal["xyz"]
    tiles: List[str] = Field(description="the URL template: .../tiles/{layer}/{z}/{x}/{y}.png; send the API key "
                                         "as the Authorization header, never in the URL")
    minzoom: Annotated[int, Field(ge=0)]
    maxzoom: Annotated[int, Field(ge=0)] = Field(description="the first zoom whose tile pixel is no larger than a "
                                                             "scene pixel: single pixels show")
    bounds: Box = Field(description="[west, south, east, north] in degrees")
    center: Annotated[List[float], Field(min_length=3, max_length=3)] = Field(description="[lon, lat, zoom]")


class SceneList(BaseModel):
    model_config = ANSWER
    object: Literal["list"]
    data: List[Scene] = Field(description="newest first")
    max_request_bytes: Count = Field(description="the largest GeoTIFF body the server takes")
    keep_s: float = Field(description="how long a finished scene is kept (server.scenes.keep_s)")
    max_kept: Count = Field(description="how many finished scenes are kept at most (server.scenes.max_kept)")
    frames: Annotated[int, Field(ge=1)] = Field(
        description="the acquisitions of one place a scene holds (model.prithvi.num_frames): more than 1, post "
                    "them as urls, as a form's files, or as one stacked GeoTIFF")


class SceneDeleted(BaseModel):
    model_config = ANSWER
    id: str
    object: Literal["scene"]
    deleted: Literal[True]
