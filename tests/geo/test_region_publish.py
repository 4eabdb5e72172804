"""`publish.url`: a region run's collection and items sent to the real STAC API of `stac_catalog` (its
Transactions extension on), read back through pystac-client as users would find them."""
import datetime as dt
import json

import pytest
from omegaconf import OmegaConf
from pystac_client import Client

from appliance.config.schema import PublishConfig
from appliance.errors import InputError
from appliance.stages.build import build_stages
from appliance.stages.geo.region_assemble import assemble
from tests.geo.conftest import make_cfg, run_geo, stages
from tests.geo.test_stac_search import search
from tests.stac_api import free_port


def publish_cfg(catalog, out, search_keys=None, **publish):
    nodes = {**stages(tile_size=64, overlap=16), "region": {}}
    keys = {**OmegaConf.to_container(OmegaConf.structured(PublishConfig)), "url": catalog.api_url, **publish}
    found = {**search(catalog, datetime="2024-04-01"), **(search_keys or {})}
    return OmegaConf.merge(make_cfg(nodes), {"search": found, "output": str(out), "publish": keys})


def publish_run(catalog, out, **publish):
    return run_geo(None, out, cfg=publish_cfg(catalog, out, **publish))


def same_properties(got, written):
    """Equal, the times as instants (the API writes `Z` where ours write `+00:00`)."""
    def instant(value):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value

    times = {"datetime", "created", "updated", "start_datetime", "end_datetime"}
    return got.keys() == written.keys() and all(
        instant(got[k]) == instant(written[k]) if k in times else got[k] == written[k] for k in got)


def published(catalog, collection_id):
    client = Client.open(catalog.api_url)
    return client.get_collection(collection_id), sorted(client.get_collection(collection_id).get_items(),
                                                        key=lambda item: item.id)


def test_a_region_is_published_where_its_scenes_were_found_and_a_rerun_updates_it(stac_catalog, tmp_path):
    out = tmp_path / "published-region"
    records = publish_run(stac_catalog, out)
    assert records[-1]["display"].startswith("region: published collection published-region and 3 items to ")
    assert records[-1]["display"].endswith("(4 created)")
    collection, items = published(stac_catalog, "published-region")
    written = json.loads((out / "collection.json").read_text())
    assert collection.extent.to_dict() == written["extent"]
    assert collection.summaries.to_dict() == written["summaries"]
    on_disk = {item["id"]: item for item in map(json.loads, (p.read_text() for p in out.glob("*.stac.json")))}
    assert sorted(on_disk) == [item.id for item in items]
    for item in items:
        mask = on_disk[item.id]["assets"]["mask"]["href"]
        assert item.assets["mask"].href == str(out / mask)  # absolute: the files stay on this machine
        assert item.collection_id == "published-region"
        assert same_properties(item.properties, on_disk[item.id]["properties"])

    again = publish_run(stac_catalog, out)  # the same ids: replaced, not duplicated
    assert again[-1]["display"].endswith("(4 updated)")
    assert len(published(stac_catalog, "published-region")[1]) == 3


def test_a_search_in_shares_is_published_once_by_assemble(stac_catalog, tmp_path):
    out = tmp_path / "shared-region"
    for share in (0, 1):  # a share's run writes its masks, and neither the region nor its publishing
        records = run_geo(None, out, cfg=publish_cfg(stac_catalog, out, {"shares": 2, "share": share}))
        assert not any("published" in record.get("display", "") for record in records)
    cfg = publish_cfg(stac_catalog, out, {"shares": 2})
    lines = list(assemble(cfg, build_stages(cfg)))
    assert lines[0] == "3 scenes of the search complete" and (out / "collection.json").is_file()
    assert lines[-1].startswith("published collection shared-region and 3 items to ")
    assert len(published(stac_catalog, "shared-region")[1]) == 3


def test_asset_base_names_where_the_directory_is_served(stac_catalog, tmp_path):
    out = tmp_path / "served-region"
    publish_run(stac_catalog, out, asset_base="https://data.example.org/floods/served-region/")
    _, items = published(stac_catalog, "served-region")
    assert sorted(item.assets["mask"].href for item in items) == \
        sorted(f"https://data.example.org/floods/served-region/{mask.name}" for mask in out.glob("*.mask.tif"))


def test_an_api_that_cannot_be_reached_is_one_clear_error_and_the_outputs_stay(stac_catalog, tmp_path):
    out = tmp_path / "unpublished"
    gone = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InputError, match=rf"^publish.url: the STAC API at {gone} did not take the region \(.*\); "
                                         rf"the outputs in {out} are complete$"):
        publish_run(stac_catalog, out, url=gone)
    assert len(list(out.glob("*.mask.tif"))) == 3
    assert {p.name for p in out.glob("*.json")} >= {"collection.json", "summary.json"}
    assert (out / "mosaic.tif").is_file()


def test_publish_url_must_be_http(tmp_path):
    from appliance.config.compose import compose
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError, match="publish.url: 'ftp://x'"):
        compose(["pipeline=prithvi_flood", "publish.url=ftp://x"])
