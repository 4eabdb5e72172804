"""`appliance serve`: the acquisition date a request gives (`/pooling`'s `data.date`, `/v1/pool`'s `?date=`)
is checked before the request queues (a 400 naming the field) and reaches the mask's tags."""
import base64
import io

import httpx
import pytest
import rasterio

from appliance.stages.geo.raster_inputs import PACKAGE_DIR
from tests.servers import API_KEY, error

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SAMPLE = PACKAGE_DIR / "assets" / "samples" / "flood_sample.tif"


def pooling(server, **fields):
    data = {"data": base64.b64encode(SAMPLE.read_bytes()).decode(), "data_format": "b64_json", **fields}
    return httpx.post(f"{server.base}/pooling", json={"model": "flood", "data": data}, headers=AUTH, timeout=120)


def raw(server, **query):
    return httpx.post(f"{server.base}/v1/pool", params=query, content=SAMPLE.read_bytes(),
                      headers={**AUTH, "Content-Type": "image/tiff"}, timeout=120)


def tags(content: bytes) -> dict:
    with rasterio.open(io.BytesIO(content)) as ds:
        return ds.tags()


@pytest.mark.parametrize("send, param, fragment", [
    (lambda s: pooling(s, date="2024-13-01"), "data.date", "data.date: '2024-13-01' is not a date"),
    (lambda s: pooling(s, date=20240630), "data.date", "data.date"),
    (lambda s: raw(s, date="30/06/2024"), "date", "date: '30/06/2024' is not a date"),
])
def test_a_bad_date_is_a_400_naming_the_field(flood_server, send, param, fragment):
    response = send(flood_server)
    assert response.status_code == 400, response.text
    body = error(response)
    assert body["param"] == param and fragment in body["message"], body


def test_a_given_date_reaches_the_mask(flood_server):
    response = pooling(flood_server, date="2024-06-30")
    assert response.status_code == 200, response.text
    assert tags(base64.b64decode(response.json()["data"]["data"]))["acquisition_date"] == "2024-06-30"
    response = raw(flood_server, date="2023-01-02")
    assert response.status_code == 200, response.text
    assert tags(response.content)["acquisition_date"] == "2023-01-02"
    assert "acquisition_date" not in tags(raw(flood_server).content)  # the sample carries no date
