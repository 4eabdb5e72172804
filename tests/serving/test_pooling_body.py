"""`/pooling` bodies checked by their pydantic model (appliance/protocol/pooling.py), in-process: errors
name the field first, as every other route's, and the OpenAPI schema is the model's own."""
import pytest

from appliance.errors import InputError
from appliance.protocol.pooling import PoolingBody, parse_pooling

SCENE = {"data": "SUkqAA==", "data_format": "b64_json"}


def test_a_full_body_parses_with_bands_made_1_based():
    parsed = parse_pooling({"model": "flood", "priority": 0, "task": "plugin",
                            "data": {**SCENE, "out_data_format": "path", "image_format": "tif", "indices": [0, 5]}})
    assert (parsed.data_format, parsed.out_data_format, parsed.model, parsed.bands) == ("b64_json", "path",
                                                                                        "flood", [1, 6])
    assert parse_pooling({"data": SCENE}).out_data_format == "b64_json"  # the default
    # vLLM's IO-processor clients (terratorch's) send `softmax`, which vLLM ignores: so do we.
    assert parse_pooling({"data": SCENE, "model": "flood", "softmax": False}).model == "flood"


def test_per_band_lists_and_an_aoi_parse_as_sent():
    parsed = parse_pooling({"data": {"data": ["s3://b/B02.tif", "https://h/B03.tif"], "data_format": "url",
                                     "aoi": [1, 2.5, 3, 4], "aoi_crs": "EPSG:32615"}})
    assert (parsed.data, parsed.aoi, parsed.aoi_crs) == (["s3://b/B02.tif", "https://h/B03.tif"], [1, 2.5, 3, 4],
                                                         "EPSG:32615")
    # the aoi's own rules (4 finite numbers, a non-empty box, a known CRS) are appliance run's: parse_aoi,
    # applied by the route (tests/geo/test_served_remote.py)


@pytest.mark.parametrize("body, param, fragment", [
    ({}, "data", "data: required, an object {data, data_format, out_data_format}"),
    ({"data": "x"}, "data", "data: expected an object"),
    ({"data": {**SCENE, "data_format": "s3"}}, "data.data_format", "'s3'; allowed: b64_json, url, path"),
    ({"data": {**SCENE, "out_data_format": "url"}}, "data.out_data_format", "allowed: b64_json, path"),
    ({"data": {**SCENE, "data": ""}}, "data.data", "expected a non-empty string"),
    ({"data": {**SCENE, "crs": "EPSG:4326"}}, "data.crs", "unknown field; allowed: aoi, aoi_crs, data, data_format"),
    ({"data": SCENE, "temperature": 1}, "temperature", "unknown field; allowed: data, model, priority"),
    ({"data": {**SCENE, "indices": [True]}}, "data.indices", "0-based band indexes, got True"),
    ({"data": {**SCENE, "indices": ["1"]}}, "data.indices", "got '1'"),   # strict: no coercion
    ({"data": {**SCENE, "indices": [-1]}}, "data.indices", "got -1"),
    ({"data": {**SCENE, "indices": []}}, "data.indices", "got []"),
    ({"data": SCENE, "priority": 1}, "priority", "1; allowed: 0"),
    ({"data": SCENE, "model": 3}, "model", "valid string, got 3"),
    ({"data": {**SCENE, "data_format": "url", "data": "ftp://x/y.tif"}}, "data.data", "http(s) URL"),
    ({"data": {**SCENE, "data_format": "url", "data": ["https://h/a.tif", "x.tif"]}}, "data.data", "http(s) URL"),
    ({"data": {**SCENE, "data": ["a.tif", "b.tif"]}}, "data.data", "per-band files takes data_format url or path"),
    ({"data": {**SCENE, "data_format": "path", "data": ["a.tif"], "indices": [0]}}, "data.indices",
     "a per-band list is already in the model's band order"),
    ({"data": {**SCENE, "data_format": "path", "data": ["a.tif", ""]}}, "data.data", "or a list of per-band"),
    ({"data": {**SCENE, "data_format": "path", "data": []}}, "data.data", "got []"),
    ({"data": {**SCENE, "aoi": "1,2,3,4"}}, "data.aoi", "[xmin, ymin, xmax, ymax] (numbers), got '1,2,3,4'"),
    ({"data": {**SCENE, "aoi": [1, 2, 3, "4"]}}, "data.aoi", "got '4'"),
    ({"data": {**SCENE, "aoi_crs": 4326}}, "data.aoi_crs", "a CRS name like EPSG:32615, got 4326"),
])
def test_bad_bodies_name_the_field(body, param, fragment):
    with pytest.raises(InputError) as info:
        parse_pooling(body)
    assert info.value.param == param and str(info.value).startswith(f"{param}: ")
    assert fragment in str(info.value)


def test_the_openapi_schema_is_the_models():
    schema = PoolingBody.model_json_schema()
    assert schema["required"] == ["data"] and schema["additionalProperties"] is False
    data = schema["$defs"]["PoolingData"]
    assert data["properties"]["data_format"]["enum"] == ["b64_json", "url", "path"]
