"""The map page at full resolution, in a real browser at 1280x800 against the shared keyed `flood_server`
(tests/servers.py): a 3660 x 3660 scene (an HLS tile's size) mapped; zoomed to its tiles' maxzoom the map
shows single pixels (a scene pixel covers at least one screen pixel, the tiles drawn at their own size);
while the pointer is on the map the pixel reading stays in the window and follows it. Screenshots go to
the test's tmp dir. A scene sent by URL is mapped by its mask alone, its input not being kept."""
import re

import httpx
import numpy as np
import pytest
import rasterio

from tests.geo.hls import RangeServer
from tests.servers import API_KEY, SAMPLE_SCENE
from tests.ui.conftest import DESKTOP
from tests.ui.test_flood_page import map_point, map_scene, pixel_lat_lon, zoom_to

SIZE = 3660
AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEY_SCRIPT = f"sessionStorage.setItem('appliance.apiKey', {API_KEY!r})"  # as the key dialog keeps it


@pytest.fixture(scope="module")
def hls_sized_scene(tmp_path_factory):
    """3660 x 3660, 30 m, six bands: blocks of 61 pixels whose bands make some water and some land."""
    path = tmp_path_factory.mktemp("hls_sized") / "scene.tif"
    rows, cols = np.indices((SIZE, SIZE)) // 61
    water = (rows + cols) % 3 == 0
    land = np.array([300, 650, 400, 3500, 1800, 900], dtype="uint16")[:, None, None]
    wet = np.array([700, 600, 400, 300, 150, 100], dtype="uint16")[:, None, None]
    data = np.where(water[None], wet, land).astype("uint16")
    with rasterio.open(path, "w", driver="GTiff", height=SIZE, width=SIZE, count=6, dtype="uint16", tiled=True,
                       crs="EPSG:32615", transform=rasterio.Affine(30, 0, 500000, 0, -30, 3300000),
                       compress="deflate") as dst:
        dst.write(data)
        dst.descriptions = ("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")
    return path


def test_zoomed_in_a_3660_pixel_result_shows_single_pixels_and_the_reading_stays_in_view(
        flood_server, hls_sized_scene, open_page, tmp_path):
    page = open_page(f"{flood_server.base}/", viewport=DESKTOP, init_script=KEY_SCRIPT)
    scene_id = map_scene(page, hls_sized_scene)
    scene = httpx.get(f"{flood_server.base}/v1/scenes/{scene_id}", headers=AUTH).json()["result"]
    assert (scene["width"], scene["height"]) == (SIZE, SIZE)
    grid = httpx.get(f"{flood_server.base}/v1/scenes/{scene_id}/tiles/mask/tilejson.json", headers=AUTH).json()
    with rasterio.open(hls_sized_scene) as ds:
        profile = ds.profile

    centre = SIZE // 2
    zoom_to(page, pixel_lat_lon(profile, centre, centre), grid["maxzoom"])
    assert page.evaluate("async () => (await import(new URL('ui/map.js', location.href))).view.map.getZoom()") == \
        grid["maxzoom"]
    here, right, below = (map_point(page, pixel_lat_lon(profile, col, row))
                          for col, row in ((centre, centre), (centre + 1, centre), (centre, centre + 1)))
    assert right[0] - here[0] >= 1 and below[1] - here[1] >= 1  # one scene pixel: at least one screen pixel
    tiles = "#viewer figure:first-child .mask-tiles .leaflet-tile-loaded"
    sizes = page.evaluate(f"[...document.querySelectorAll('{tiles}')]"
                          ".map(t => [t.width, t.getBoundingClientRect().width])")
    assert sizes and all(drawn == [256, 256] for drawn in sizes)  # the tiles at their own size: no scaling

    readings = []
    for col in (centre - 40, centre + 40):  # blocks of 61 pixels: two blocks apart, water on one of them
        for row in (centre - 40, centre + 40):
            page.mouse.move(*map_point(page, pixel_lat_lon(profile, col, row)))
            page.wait_for_function("() => document.getElementById('read-class').textContent !== 'loading…'")
            box = page.locator("#reading").bounding_box()
            assert 0 <= box["y"] and box["y"] + box["height"] <= DESKTOP["height"], box  # in the window
            assert page.locator("#reading").is_visible()
            pixel = re.fullmatch(r"col (\d+), row (\d+)", page.text_content("#read-pixel"))
            assert abs(int(pixel[1]) - col) <= 1 and abs(int(pixel[2]) - row) <= 1
            readings.append(page.text_content("#read-class"))
    assert set(readings) == {"water", "land"}, readings
    page.screenshot(path=tmp_path / "map-full-resolution.png")
    assert (tmp_path / "map-full-resolution.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.problems == []


def test_a_scene_sent_by_url_is_mapped_by_its_mask_alone(flood_server, open_page, tmp_path):
    (tmp_path / "scene.tif").write_bytes(SAMPLE_SCENE.read_bytes())
    with RangeServer(tmp_path) as source:
        page = open_page(f"{flood_server.base}/", viewport=DESKTOP, init_script=KEY_SCRIPT)
        page.wait_for_selector("#limits:not(:empty)")
        page.fill("#url", f"{source.url}/scene.tif")
        page.click("#run-url")
        page.wait_for_selector("#result:not([hidden]), #notice:not(:empty)", timeout=120_000)
    assert page.text_content("#notice") == ""
    page.wait_for_selector("#viewer .mask-tiles .leaflet-tile-loaded")
    assert page.locator("#viewer .scene-tiles").count() == 0 and page.locator("#link-scene-tiles").count() == 0
    assert not any("/tiles/scene/" in url for url in page.requested)
    assert page.problems == []
