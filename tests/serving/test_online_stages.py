"""Which stages the server runs: errors name the stage by its id in pipeline.stages (in-process)."""
import pytest

from appliance.config.compose import compose
from appliance.errors import ConfigError
from appliance.stages.build import build_pipeline
from appliance.serving.online_stages import split_online


def test_online_stages_around_the_engine():
    cfg = compose(["pipeline=prithvi_flood"])
    online = split_online(build_pipeline(cfg), cfg)
    assert online.kind == "pool"
    assert [s.id for s in online.head] == ["raster_read", "tile", "normalize"]
    assert [s.id for s in online.tail] == ["stitch", "raster_write"]


@pytest.mark.parametrize("overrides, fragments", [
    (["pipeline=llava_chat", "+pipeline.stages.again={stage: chat_prompt}"],
     ["pipeline.stages.again (chat_prompt) follows a generating engine"]),
    (["pipeline=llava_chat", "+pipeline.stages.second={stage: engine}"], ["2 engine stages (engine, second)"]),
])
def test_pipelines_a_server_cannot_feed_are_refused(overrides, fragments):
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as info:
        split_online(build_pipeline(cfg), cfg)
    for fragment in fragments:
        assert fragment in str(info.value)
