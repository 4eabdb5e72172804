"""The map page of a flood-mapping pipeline (`GET /` of `pipeline=prithvi_flood`) in a real browser, against
a server of its own (12 tiles for the sample scene) and the shared keyed `flood_server`: it loads clean;
the sample uploaded shows its progress, then the mask's tiles over the scene's on a map, with the water
share numpy counts on `appliance run`'s mask, and the tiles' and mask's URLs; the mask downloaded equals
run's pixel for pixel and the STAC item downloads; pointing at a pixel at the map's maxzoom reads its
coordinates and class, and panning with the keys moves the reading; the date field is sent when filled, with a file and
with a URL; a failed scene names the file the person chose; a file name with markup stays text; with an
API key the page asks for it, then works; it works behind a path prefix. Screenshots at desktop and phone
width go to the test's tmp dir."""
import json
import re

import httpx
import numpy as np
import pytest
import rasterio
from rasterio.warp import transform as warp

from tests.conftest import run_cli
from tests.server_process import server_process
from tests.servers import API_KEY, SAMPLE_IMAGE, SAMPLE_SCENE, error
from tests.ui.conftest import PHONE
from tests.ui.prefix_proxy import prefix_proxy
from tests.ui.test_chat_page import MARKUP, other_problems

TILES = ["pipeline.stages.tile.tile_size=128"]  # the 400x300 sample in 12 tiles
WATER, NODATA = 1, 255


@pytest.fixture(scope="module")
def scene_server(tmp_path_factory):
    with server_process("pipeline=prithvi_flood", *TILES, cwd=tmp_path_factory.mktemp("flood_page")) as server:
        yield server


@pytest.fixture(scope="module")
def run_mask(tmp_path_factory):
    """`appliance run`'s mask of the sample, tiled as the server tiles it: (classes, rasterio profile)."""
    out = tmp_path_factory.mktemp("flood_run") / "mask.tif"
    result = run_cli("run", "pipeline=prithvi_flood", f"input={SAMPLE_SCENE}", f"output={out}", *TILES)
    assert result.returncode == 0, result.stderr
    with rasterio.open(out) as mask:
        return mask.read(1), mask.profile


def map_scene(page, *files):
    """Chooses `files` with the picker; returns the scene's id once the map is shown (fails on a notice)."""
    page.wait_for_selector("#limits:not(:empty)")  # GET v1/scenes answered
    page.set_input_files("#picker", list(files))
    page.wait_for_selector("#result:not([hidden]), #notice:not(:empty)", timeout=120_000)
    assert page.text_content("#notice") == ""
    return page.evaluate("decodeURIComponent(location.hash.slice(1))")


def record_job_states(page):
    """From now on, window.__states lists every text the job's state line shows."""
    page.evaluate("""() => {
        window.__states = [];
        const line = document.getElementById('job-state');
        new MutationObserver(() => window.__states.push(line.textContent))
            .observe(line, {childList: true, characterData: true, subtree: true});
    }""")


MAP = "(await import(new URL('ui/map.js', location.href))).view.map"  # the page's Leaflet map


def pixel_lat_lon(profile, col, row):
    """[lat, lon] of pixel (col, row)'s centre, as rasterio places it."""
    (lon,), (lat,) = warp(profile["crs"], "EPSG:4326", *[[v] for v in profile["transform"] @ (col + 0.5, row + 0.5)])
    return [lat, lon]


def map_point(page, lat_lon):
    """The page coordinates of [lat, lon] on the map."""
    point = page.evaluate(f"async (at) => {MAP}.latLngToContainerPoint(at)", lat_lon)
    box = page.locator("#viewer .map-box").first.bounding_box()
    return box["x"] + point["x"], box["y"] + point["y"]


def zoom_to(page, lat_lon, zoom):
    """Centre the map on [lat, lon] at `zoom`, and wait for its mask tiles to be drawn."""
    page.evaluate(f"async ([at, zoom]) => {MAP}.setView(at, zoom, {{animate: false}})", [lat_lon, zoom])
    page.wait_for_function("() => [...document.querySelectorAll('#viewer .mask-tiles .leaflet-tile')]"
                           ".some(t => t.classList.contains('leaflet-tile-loaded'))")


def test_the_page_loads_with_no_error_and_shows_the_model_and_status(scene_server, open_page):
    page = open_page(f"{scene_server.base}/")
    page.wait_for_selector("#status .state.ready")
    page.wait_for_selector("#limits:not(:empty)")
    assert page.text_content("#model") == httpx.get(f"{scene_server.base}/v1/models").json()["data"][0]["id"]
    assert page.is_visible("#date") and page.is_hidden("#dates")  # one date: no per-date pickers (test_crops_page)
    page.wait_for_selector("#status >> text=tiles/s", timeout=10_000)  # from two readings of /metrics
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, textarea, button')]
        .filter(c => !(c.labels?.length || c.getAttribute('aria-label') || c.textContent.trim())).map(c => c.id)""")
    assert unlabelled == []
    assert page.problems == []


def test_the_sample_shows_progress_then_the_map_with_the_water_share_of_run(scene_server, run_mask, open_page,
                                                                           screenshot):
    page = open_page(f"{scene_server.base}/")
    page.wait_for_selector("#limits:not(:empty)")
    record_job_states(page)
    scene_id = map_scene(page, SAMPLE_SCENE)
    scene = httpx.get(f"{scene_server.base}/v1/scenes/{scene_id}").json()
    total = scene["tiles_total"]
    assert scene["status"] == "done" and total == 12

    states = page.evaluate("window.__states")
    assert states[0].startswith("uploading") and re.fullmatch(rf"done: {total} tiles in [\d.]+ s", states[-1]), states
    counts = [int(m[1]) for s in states if (m := re.fullmatch(rf"running: (\d+) of {total} tiles", s))]
    assert counts == sorted(counts), states
    progress = page.locator("#job-progress")
    assert (progress.get_attribute("value"), progress.get_attribute("max")) == (str(total), str(total))

    classes, profile = run_mask
    valid = classes != NODATA
    share = (classes[valid] == WATER).sum() / valid.sum()
    area = (classes == WATER).sum() * abs(profile["transform"].a * profile["transform"].e) / 1e6
    water = page.text_content("#headline")
    shown = re.fullmatch(r"Water: ([\d.]+) km² · ([\d.]+) % of the valid pixels", water)
    assert shown, water
    assert abs(float(shown[2]) - 100 * share) <= 0.05 + 1e-9 and abs(float(shown[1]) - area) <= 0.005 + 1e-9
    assert page.locator("#legend .name").all_text_contents() == ["land (not coloured)", "water", "no data"]
    facts = dict(zip(page.locator("#facts dt").all_text_contents(), page.locator("#facts dd").all_text_contents()))
    assert facts["Size"] == f"{profile['width']} × {profile['height']} pixels"
    assert facts["CRS"] == profile["crs"].to_string() and facts["Pixel"] == "30 × 30 m"

    page.wait_for_selector("#viewer .mask-tiles .leaflet-tile-loaded")
    page.wait_for_selector("#viewer .scene-tiles .leaflet-tile-loaded")
    opacity = "document.querySelector('#viewer .mask-tiles').style.opacity"
    assert page.evaluate(opacity) == "0.6"  # the mask over the scene, at the slider's value
    page.fill("#opacity", "30")
    assert page.evaluate(opacity) == "0.3"
    assert page.locator("#viewer figure").nth(1).is_hidden()
    page.check("#side-by-side")
    assert page.locator("#viewer figure").nth(1).is_visible()
    page.wait_for_selector("#viewer figure:nth-child(2) .mask-tiles .leaflet-tile-loaded")
    assert page.locator("#viewer .leaflet-control-scale-line").first.is_visible()
    links = {i: page.input_value(f"#{i}") for i in ("link-mask-tiles", "link-scene-tiles", "link-cog")}
    base = f"{scene_server.base}/v1/scenes/{scene_id}"
    assert links == {"link-mask-tiles": f"{base}/tiles/mask/{{z}}/{{x}}/{{y}}.png",
                     "link-scene-tiles": f"{base}/tiles/scene/{{z}}/{{x}}/{{y}}.png", "link-cog": f"{base}/mask.tif"}
    page.mouse.move(*map_point(page, pixel_lat_lon(profile, 200, 150)))
    assert page.problems == []

    screenshot(page, "page-map-desktop.png", full_page=True)
    page.set_viewport_size(PHONE)
    screenshot(page, "page-map-phone.png", full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # nothing wider than a phone


def test_the_downloaded_mask_equals_run_and_the_stac_item_downloads(scene_server, run_mask, open_page):
    page = open_page(f"{scene_server.base}/")
    scene_id = map_scene(page, SAMPLE_SCENE)
    with page.expect_download() as mask_download:
        page.click("#download-mask")
    download = mask_download.value
    assert download.suggested_filename == f"{scene_id}.mask.tif" and download.url.startswith("blob:")
    classes, profile = run_mask
    with rasterio.open(download.path()) as got:
        assert np.array_equal(got.read(1), classes)
        assert (got.crs, got.transform, got.nodata) == (profile["crs"], profile["transform"], profile["nodata"])

    with page.expect_download() as item_download:
        page.click("#download-item")
    with open(item_download.value.path(), "rb") as saved:
        item = saved.read()
    assert item == httpx.get(f"{scene_server.base}/v1/scenes/{scene_id}/item.json").content
    assert json.loads(item)["type"] == "Feature"
    assert page.problems == []


def test_pointing_at_a_pixel_reads_its_coordinates_and_class(scene_server, run_mask, open_page):
    page = open_page(f"{scene_server.base}/")
    scene_id = map_scene(page, SAMPLE_SCENE)
    maxzoom = httpx.get(f"{scene_server.base}/v1/scenes/{scene_id}/tiles/mask/tilejson.json").json()["maxzoom"]
    classes, profile = run_mask
    transform = profile["transform"]
    # A pixel of each class whose neighbours share its class, so a point off by one still reads it.
    same = np.ones(classes.shape, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            same &= np.roll(classes, (dy, dx), axis=(0, 1)) == classes
    same[[0, -1], :] = same[:, [0, -1]] = False
    for value, name in ((WATER, "water"), (0, "land"), (NODATA, "no data")):
        row, col = (int(i) for i in np.argwhere(same & (classes == value))[0])
        zoom_to(page, pixel_lat_lon(profile, col, row), maxzoom)
        page.mouse.move(*map_point(page, pixel_lat_lon(profile, col, row)))
        page.wait_for_function("() => document.getElementById('read-class').textContent !== 'loading…'")
        read = re.fullmatch(r"col (\d+), row (\d+)", page.text_content("#read-pixel"))
        got_col, got_row = int(read[1]), int(read[2])
        assert abs(got_col - col) <= 1 and abs(got_row - row) <= 1
        assert page.text_content("#read-class") == name
        x, y = transform @ (got_col + 0.5, got_row + 0.5)
        assert page.text_content("#read-xy") == f"x {x:.1f}, y {y:.1f} ({profile['crs'].to_string()})"
        (lon,), (lat,) = warp(profile["crs"], "EPSG:4326", [x], [y])
        lat_text, lon_text = re.fullmatch(r"([\d.]+)° N, ([\d.]+)° W", page.text_content("#read-latlon")).groups()
        assert abs(float(lat_text) - lat) < 2e-5 and abs(float(lon_text) + lon) < 2e-5  # bilinear on a 9x9 grid

    page.focus("#viewer .map-box")
    page.keyboard.press("ArrowRight")  # the map pans west to east: the pointer is over a pixel further east
    page.wait_for_function(f"() => !document.getElementById('read-pixel').textContent.startsWith('col {got_col},')")
    moved = re.fullmatch(r"col (\d+), row (\d+)", page.text_content("#read-pixel"))
    assert int(moved[1]) > got_col and abs(int(moved[2]) - got_row) <= 1
    assert page.problems == []


def test_the_date_field_is_sent_with_a_file_and_with_a_url_when_filled(scene_server, open_page):
    page = open_page(f"{scene_server.base}/")
    page.wait_for_selector("#limits:not(:empty)")
    page.fill("#date", "2024-06-30")
    with page.expect_request(lambda r: r.method == "POST" and "/v1/scenes" in r.url) as posted:
        map_scene(page, SAMPLE_SCENE)
    assert posted.value.url.endswith("/v1/scenes?date=2024-06-30")
    facts = dict(zip(page.locator("#facts dt").all_text_contents(), page.locator("#facts dd").all_text_contents()))
    assert facts["Acquired"] == "2024-06-30 (date given)"
    url = "http://169.254.169.254/scene.tif"  # refused by the server's fetch rules: the scene fails at once
    page.fill("#url", url)
    with page.expect_request(lambda r: r.method == "POST" and "/v1/scenes" in r.url) as posted:
        page.click("#run-url")
    assert posted.value.url.endswith("/v1/scenes") and json.loads(posted.value.post_data) == {
        "url": url, "date": "2024-06-30"}
    page.wait_for_selector("#notice:not(:empty)", timeout=60_000)
    page.fill("#date", "")
    with page.expect_request(lambda r: r.method == "POST" and "/v1/scenes" in r.url) as posted:
        page.click("#run-url")
    assert json.loads(posted.value.post_data) == {"url": url}  # an empty field is left out


def test_a_failed_scene_names_the_chosen_file_and_a_markup_name_stays_text(scene_server, open_page):
    """The API names the field the file came in (`param` body); the page names the file the person chose."""
    page = open_page(f"{scene_server.base}/")
    page.wait_for_selector("#limits:not(:empty)")
    name = f"{MARKUP}.tif"
    page.set_input_files("#picker", {"name": name, "mimeType": "image/tiff", "buffer": SAMPLE_IMAGE.read_bytes()})
    page.wait_for_selector("#notice:not(:empty)", timeout=120_000)
    direct = httpx.post(f"{scene_server.base}/v1/pool", content=SAMPLE_IMAGE.read_bytes(),
                        headers={"Content-Type": "image/tiff"}, timeout=60)
    assert direct.status_code == 400 and error(direct)["param"] == "body"
    refusal = "is a PNG file, not a GeoTIFF; convert it (gdal_translate -of GTiff)"
    assert error(direct)["message"] == f"body: {refusal}"
    assert page.text_content("#notice") == f"{name}: {refusal}"
    assert page.text_content("#job-name") == name
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x], main script").count() == 0
    assert page.is_enabled("#picker") and page.is_hidden("#result")  # ready for another scene
    assert page.problems == []


def test_with_an_api_key_the_page_asks_for_it_then_maps_and_downloads(flood_server, open_page):
    page = open_page(f"{flood_server.base}/")
    page.wait_for_selector("#key-dialog[open]")  # GET v1/scenes answered 401
    page.fill("#key-input", "wrong")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-reason >> text=The key was refused")
    assert page.text_content("#status") == ""  # nothing of the server's state before the key
    page.fill("#key-input", API_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#status .state.ready")
    with page.expect_request("**/v1/scenes/*/tiles/mask/*/*/*.png") as tile:
        scene_id = map_scene(page, SAMPLE_SCENE)
    assert tile.value.headers["authorization"] == f"Bearer {API_KEY}"
    with page.expect_download() as download:
        page.click("#download-mask")
    assert download.value.suggested_filename == f"{scene_id}.mask.tif"
    assert all(API_KEY not in url for url in page.requested) and API_KEY not in page.url
    assert page.evaluate("sessionStorage.getItem('appliance.apiKey')") == API_KEY
    assert other_problems(page, 401) == []


def test_the_page_works_under_a_path_prefix(scene_server, open_page):
    with prefix_proxy(scene_server.base, "/apps/flood") as base:
        page = open_page(base)  # no trailing slash: the server sends the browser to the page's own path
        assert page.url == f"{base}/index.html"
        map_scene(page, SAMPLE_SCENE)
        with page.expect_download():
            page.click("#download-mask")
    served = [url for url in page.requested[1:] if not url.startswith("blob:")]  # after `base` itself
    assert served and all(url.startswith(f"{base}/") for url in served), served
    assert page.problems == []
