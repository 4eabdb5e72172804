"""A done scene's map tiles on the real flood server (tests/servers.py), with httpx: a tile at the layer's
maxzoom holds the mask's classes (or the input's stretched RGB) at its pixels' centres, as rasterio reads
them through morecantile's tile bounds; a tile beyond the scene is transparent; the TileJSON; a scene sent
by URL has the mask layer only; refusals that name the field; the key; the OpenAPI document."""
import asyncio
import io
import json
import math

import httpx
import morecantile
import numpy as np
import pytest
import rasterio
from PIL import Image
from rasterio.warp import transform as warp_transform

from starlette.requests import Request

from appliance.protocol.scenes import TileJSON
from appliance.serving.http.errors import APIError
from appliance.serving.http.routes_tiles import SceneTileRoutes
from appliance.serving.http.scene_jobs import SceneJobs
from appliance.stages.geo.quicklook import stretched
from tests.geo.hls import RangeServer
from tests.servers import API_KEY, SAMPLE_SCENE, error
from tests.serving.test_scenes import posted, until_ended

AUTH = {"Authorization": f"Bearer {API_KEY}"}
WEB_MERCATOR = morecantile.tms.get("WebMercatorQuad")
EDGE = 0.2  # tile pixels whose centre falls this close (in scene pixels) to a scene pixel's edge are not compared


@pytest.fixture(scope="module")
def done(flood_server, flood_dirs):
    """The sample scene mapped: its scene object and its directory in the server's spool."""
    body = until_ended(flood_server, posted(flood_server, SAMPLE_SCENE.read_bytes())["id"])
    assert body["status"] == "done", body
    return body, flood_dirs["spool"] / "scenes" / body["id"]


def tiles_url(server, scene_id: str, path: str) -> str:
    return f"{server.base}/v1/scenes/{scene_id}/tiles/{path}"


def fetch(server, scene_id: str, path: str, headers=AUTH):
    return httpx.get(tiles_url(server, scene_id, path), headers=headers, timeout=60)


def tilejson(server, scene_id: str, layer: str) -> dict:
    answer = fetch(server, scene_id, f"{layer}/tilejson.json")
    assert answer.status_code == 200, answer.text
    return TileJSON.model_validate(answer.json()).model_dump()


def rgba_tile(answer) -> np.ndarray:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    picture = Image.open(io.BytesIO(answer.content))
    assert (picture.format, picture.size) == ("PNG", (256, 256))
    return np.asarray(picture.convert("RGBA"))


def source_pixels(path, tile):
    """(rows, cols, clear) of the scene pixel under each tile pixel's centre, and whether that centre lies
    at least EDGE from the pixel's edges (nearest resampling may take either neighbour at an edge)."""
    left, bottom, right, top = WEB_MERCATOR.xy_bounds(tile)
    size = (right - left) / 256
    xs, ys = np.meshgrid(left + (np.arange(256) + 0.5) * size, top - (np.arange(256) + 0.5) * size)
    with rasterio.open(path) as ds:
        x, y = warp_transform("EPSG:3857", ds.crs, xs.ravel(), ys.ravel())
        cols, rows = ~ds.transform @ (np.asarray(x), np.asarray(y))
    cols, rows = np.asarray(cols).reshape(256, 256), np.asarray(rows).reshape(256, 256)
    fraction = np.minimum(np.abs(cols - np.round(cols)), np.abs(rows - np.round(rows)))
    return np.floor(rows).astype(int), np.floor(cols).astype(int), fraction >= EDGE


def centre_tile(grid: dict) -> morecantile.Tile:
    lon, lat, _ = grid["center"]
    return WEB_MERCATOR.tile(lon, lat, grid["maxzoom"])


def test_the_tilejson_names_the_template_the_bounds_and_the_zoom_of_single_pixels(flood_server, done):
    body, _ = done
    grid = tilejson(flood_server, body["id"], "mask")
    assert grid["tiles"] == [tiles_url(flood_server, body["id"], "mask/{z}/{x}/{y}.png")]
    assert grid["bounds"] == pytest.approx(body["result"]["lonlat_bounds"], abs=1e-6)
    lat = (grid["bounds"][1] + grid["bounds"][3]) / 2
    ground = [WEB_MERCATOR.matrix(z).cellSize * math.cos(math.radians(lat)) for z in range(25)]
    pixel_m = 30  # the sample's grid
    assert ground[grid["maxzoom"]] <= pixel_m < ground[grid["maxzoom"] - 1]
    assert 0 <= grid["minzoom"] <= grid["maxzoom"]
    assert tilejson(flood_server, body["id"], "scene")["tiles"] == [
        tiles_url(flood_server, body["id"], "scene/{z}/{x}/{y}.png")]


def tile_over(path, value, zoom: int) -> morecantile.Tile:
    """The tile at `zoom` over the pixel nearest the mask's centre that holds `value`."""
    with rasterio.open(path) as ds:
        held = np.argwhere(ds.read(1) == value)
        row, col = (int(i) for i in held[np.abs(held - [ds.height / 2, ds.width / 2]).sum(axis=1).argmin()])
        (lon,), (lat,) = warp_transform(ds.crs, "EPSG:4326", *[[v] for v in ds.transform @ (col + 0.5, row + 0.5)])
    return WEB_MERCATOR.tile(lon, lat, zoom)


@pytest.mark.parametrize("over,values", [(1, {0, 1}), (255, {0, 255})])  # water and land; no data
def test_a_mask_tile_at_maxzoom_holds_the_masks_classes_in_their_colours(flood_server, done, over, values):
    body, spool = done
    mask_path = spool / f"{body['id']}.mask.tif"
    tile = tile_over(mask_path, over, tilejson(flood_server, body["id"], "mask")["maxzoom"])
    pixels = rgba_tile(fetch(flood_server, body["id"], f"mask/{tile.z}/{tile.x}/{tile.y}.png"))
    rows, cols, clear = source_pixels(mask_path, tile)
    with rasterio.open(mask_path) as ds:
        mask = ds.read(1)
    inside = (rows >= 0) & (rows < mask.shape[0]) & (cols >= 0) & (cols < mask.shape[1])
    compared = clear & inside
    assert compared.sum() > 256 * 256 // 20
    classes = mask[rows[compared], cols[compared]]
    assert set(np.unique(classes)) >= values
    colours = {entry["index"]: entry["colour"] for entry in body["result"]["classes"]}
    shown = pixels[compared]
    assert np.array_equal(shown[:, 3] == 255, classes != 0)  # class 0 transparent
    for value, colour in ((1, colours[1]), (255, body["result"]["nodata_colour"])):
        assert (shown[classes == value, :3] == colour).all()
    assert (pixels[~inside & clear, 3] == 0).all()  # beyond the scene's edge


def test_a_scene_tile_shows_the_inputs_rgb_stretched_as_the_preview(flood_server, done):
    body, spool = done
    tile = centre_tile(tilejson(flood_server, body["id"], "scene"))
    pixels = rgba_tile(fetch(flood_server, body["id"], f"scene/{tile.z}/{tile.x}/{tile.y}.png"))
    rendering = json.loads((spool / "scene_rgb.json").read_text())
    assert rendering["bands"] == [3, 2, 1]  # RED, GREEN, BLUE of the sample
    rows, cols, clear = source_pixels(SAMPLE_SCENE, tile)
    with rasterio.open(SAMPLE_SCENE) as ds:
        data = ds.read(rendering["bands"]).astype(np.float32)
        inside = (rows >= 0) & (rows < ds.height) & (cols >= 0) & (cols < ds.width)
    compared = clear & inside
    expected = stretched(data[:, rows[compared], cols[compared]][:, None, :], rendering["ranges"])[:, 0, :].T
    shown = pixels[compared]
    valid = shown[:, 3] == 255
    assert valid.mean() > 0.9
    assert np.array_equal(shown[valid, :3], expected[valid])


def test_the_mask_cog_answers_range_requests_as_gdal_reads_it(flood_server, done):
    """QGIS and GDAL read the COG's URL block by block (docs/geo.md, "The result in QGIS or a web map")."""
    body, spool = done
    whole = (spool / f"{body['id']}.mask.tif").read_bytes()
    answer = httpx.get(f"{flood_server.base}/v1/scenes/{body['id']}/mask.tif",
                       headers={**AUTH, "Range": "bytes=100-299"}, timeout=60)
    assert answer.status_code == 206 and answer.content == whole[100:300]


def test_a_tile_beyond_the_scene_is_transparent(flood_server, done):
    body, _ = done
    grid = tilejson(flood_server, body["id"], "mask")
    far = WEB_MERCATOR.tile(grid["bounds"][0] + 10, grid["bounds"][1] + 10, grid["maxzoom"])
    for layer in ("mask", "scene"):
        pixels = rgba_tile(fetch(flood_server, body["id"], f"{layer}/{far.z}/{far.x}/{far.y}.png"))
        assert (pixels[..., 3] == 0).all()


@pytest.mark.parametrize("path,status,param", [
    ("ndvi/10/1/1.png", 404, "layer"),
    ("ndvi/tilejson.json", 404, "layer"),
    ("mask/ten/1/1.png", 400, "z"),
    ("mask/25/0/0.png", 400, "z"),
    ("mask/3/8/0.png", 400, "x"),
    ("mask/3/0/-1.png", 400, "y"),
    ("mask/3/0/8.png", 400, "y"),
])
def test_bad_layers_and_tile_indexes_are_refused_naming_the_field(flood_server, done, path, status, param):
    answer = fetch(flood_server, done[0]["id"], path)
    assert answer.status_code == status, answer.text
    assert error(answer)["param"] == param


def test_a_scene_sent_by_url_has_the_mask_layer_only(flood_server, tmp_path):
    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    with RangeServer(tmp_path) as source:
        sent = posted(flood_server, json={"url": f"{source.url}/scene.tif"}, headers=AUTH)
        body = until_ended(flood_server, sent["id"])
    assert body["status"] == "done", body
    for path in ("scene/tilejson.json", "scene/10/0/0.png"):
        answer = fetch(flood_server, body["id"], path)
        assert answer.status_code == 404 and error(answer)["param"] == "layer"
        assert "read from its URL" in error(answer)["message"]
    tile = centre_tile(tilejson(flood_server, body["id"], "mask"))
    assert (rgba_tile(fetch(flood_server, body["id"], f"mask/{tile.z}/{tile.x}/{tile.y}.png"))[..., 3] > 0).any()


def test_tiles_of_no_such_scene_are_404_and_need_the_key(flood_server, done):
    assert error(fetch(flood_server, "scene-nope", "mask/1/0/0.png"))["param"] == "id"
    assert fetch(flood_server, done[0]["id"], "mask/1/0/0.png", headers={}).status_code == 401
    assert fetch(flood_server, done[0]["id"], "mask/tilejson.json", headers={}).status_code == 401


def test_the_openapi_document_lists_the_tile_routes(flood_server):
    paths = httpx.get(f"{flood_server.base}/openapi.json", timeout=30).json()["paths"]
    tile = paths["/v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png"]["get"]
    params = {p["name"]: p["schema"] for p in tile["parameters"]}
    assert params["layer"]["enum"] == ["mask", "scene"] and params["z"]["maximum"] == 24
    assert "image/png" in tile["responses"]["200"]["content"]
    assert "application/json" in paths["/v1/scenes/{id}/tiles/{layer}/tilejson.json"]["get"]["responses"]["200"][
        "content"]


def test_a_scene_without_a_crs_has_no_tiles(tmp_path):
    jobs = SceneJobs(str(tmp_path), keep_s=60, max_kept=4)
    job = jobs.add()
    with open(job.output_path, "wb") as f:
        f.write(b"a mask without a CRS")
    job.succeed({"crs": None}, jobs.now())
    params = {"id": job.id, "layer": "mask", "z": "1", "x": "0", "y": "0"}
    with pytest.raises(APIError) as refused:
        asyncio.run(SceneTileRoutes(jobs).tile(Request({"type": "http", "path_params": params})))
    assert (refused.value.status, refused.value.param) == (404, "layer") and "no CRS" in refused.value.message
