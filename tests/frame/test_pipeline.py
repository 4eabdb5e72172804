"""Stage registry, option validation and the field-graph check, in-process."""
from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from appliance.config.compose import compose
from appliance.errors import ConfigError, InputError
from appliance.pipeline import STAGES, Stage, register_stage
from appliance.stages.build import build_pipeline
from tests.frame import stages as frame_stages  # registers the test stages


def with_stages(frame_conf, stages, inputs=("input",)):
    cfg = compose([])
    cfg.pipeline.stages = dict(stages)
    cfg.pipeline.inputs = list(inputs)
    return cfg


def test_pipeline_streams_records_through_stages(frame_conf, tmp_path):
    numbers = tmp_path / "n.txt"
    numbers.write_text("1 2 3\n")
    pipeline = build_pipeline(compose([f"input={numbers}"]))
    assert [s.name for s in pipeline.stages] == ["read_numbers", "scale", "total"]
    assert pipeline.stages[1].options.factor == 2.0
    assert list(pipeline.run([{"input": str(numbers)}])) == [{"display": "total 12"}]


def test_interpolated_options_resolve(frame_conf):
    cfg = with_stages(frame_conf, {"read_numbers": {}, "scale": {"factor": "${engine.max_batch_size}"}})
    assert build_pipeline(cfg).stages[1].options.factor == cfg.engine.max_batch_size


@pytest.mark.parametrize(
    "stages, inputs, fragments",
    [
        ({"first": {"stage": "nope"}}, ["input"],
         ["pipeline.stages.first.stage", "unknown stage 'nope'", "read_numbers"]),
        ({"factor": {"factor": 2}}, ["input"], ["pipeline.stages.factor", "'stage' key"]),
        ({"scale": "x"}, ["input"], ["pipeline.stages.scale", "'stage' key"]),
        ({"read_numbers": {}, "scale": {"factr": 2}}, ["input"],
         ["pipeline.stages.scale.factr", "allowed: factor"]),
        ({"read_numbers": {}, "scale": {"factor": "big"}}, ["input"],
         ["pipeline.stages.scale.factor", "Float"]),
        ({"read_numbers": {}, "needs_pixels": {}}, ["input"],
         ["pipeline.stages.needs_pixels (needs_pixels)", "'pixels'", "available: input, number"]),
        ({"scale": {}}, ["input"], ["pipeline.stages.scale (scale)", "'number'"]),
        ({"read_numbers": {}}, ["path"], ["'input'", "available: path"]),
    ],
)
def test_graph_and_option_errors(frame_conf, stages, inputs, fragments):
    with pytest.raises(ConfigError) as info:
        build_pipeline(with_stages(frame_conf, stages, inputs=inputs))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unimportable_plugin_is_a_config_error(frame_conf):
    cfg = compose([])
    cfg.plugins = ["tests.no_such_module"]
    with pytest.raises(ConfigError, match="plugins: cannot import 'tests.no_such_module'"):
        build_pipeline(cfg)


def test_register_stage_rejects_duplicates_and_nameless():
    class Nameless(Stage):
        pass

    with pytest.raises(TypeError, match="needs a `name`"):
        register_stage(Nameless)

    class Impostor(Stage):
        name = "scale"

    with pytest.raises(TypeError, match="already registered"):
        register_stage(Impostor)
    assert STAGES["scale"] is frame_stages.Scale


def test_setup_and_close_run_once_in_order(frame_conf):
    calls = []

    @dataclass
    class Opts:
        tag: str = ""

    class Tracer(Stage):
        name = "tracer_for_test"
        Options = Opts

        def setup(self):
            calls.append(("setup", self.options.tag))

        def close(self):
            calls.append(("close", self.options.tag))

    register_stage(Tracer)
    try:
        cfg = with_stages(frame_conf, {"a": {"stage": "tracer_for_test", "tag": "a"},
                                       "b": {"stage": "tracer_for_test", "tag": "b"}})
        pipeline = build_pipeline(cfg)
        pipeline.setup()
        pipeline.close()
        assert calls == [("setup", "a"), ("setup", "b"), ("close", "b"), ("close", "a")]
        assert OmegaConf.is_config(pipeline.stages[0].cfg)
    finally:
        STAGES.pop("tracer_for_test")


def test_stages_set_up_lazily_after_upstream_validated_input(frame_conf, tmp_path):
    """A bad input found by an early stage is reported before later stages (weights) set up."""
    calls = []

    class Loader(Stage):
        name = "loader_for_test"
        consumes = ("number",)

        def setup(self):
            calls.append("setup")

        def map(self, record):
            return record

    register_stage(Loader)
    try:
        pipeline = build_pipeline(with_stages(frame_conf, {"read_numbers": {}, "loader_for_test": {}}))
        with pytest.raises(Exception, match="does not exist"):
            list(pipeline.run([{"input": str(tmp_path / "missing.txt")}]))
        assert calls == []
        empty = tmp_path / "empty.txt"
        empty.write_text("")
        assert list(pipeline.run([{"input": str(empty)}])) == [] and calls == []
        empty.write_text("5")
        assert [r["number"] for r in pipeline.run([{"input": str(empty)}])] == [5.0]
        assert calls == ["setup"]
        pipeline.close()
    finally:
        STAGES.pop("loader_for_test")


def test_a_stage_that_runs_without_records_acts_on_an_empty_stream(frame_conf, tmp_path):
    """A stage that writes what a run adds up to (geo's `region`) runs when nothing reaches it; others do not."""

    class Totals(Stage):
        name = "totals_for_test"
        consumes = ("number",)
        runs_without_records = True

        def process(self, records):
            numbers = [r["number"] for r in records]
            yield {"total": sum(numbers), "count": len(numbers)}

    register_stage(Totals)
    try:
        pipeline = build_pipeline(with_stages(frame_conf, {"read_numbers": {}, "totals_for_test": {}}))
        empty = tmp_path / "empty.txt"
        empty.write_text("")
        assert list(pipeline.run([{"input": str(empty)}])) == [{"total": 0, "count": 0}]
        empty.write_text("5\n6")
        assert list(pipeline.run([{"input": str(empty)}])) == [{"total": 11.0, "count": 2}]
        pipeline.close()
    finally:
        STAGES.pop("totals_for_test")


def test_shared_values_are_made_once_and_may_be_made_from_each_other():
    """A pipeline's shared values (the tokenizer, its longest entry, ...) are made on first use, once,
    and one may be made from another (a non-re-entrant lock hung `appliance run` here)."""
    import threading

    from appliance.pipeline import Shared

    shared, made = Shared(), []

    def tokenizer():
        made.append("tokenizer")
        return {"hello": 0, "world!": 1}

    def longest():
        made.append("longest")
        return max(map(len, shared.get("tokenizer", tokenizer)))

    answers = []
    worker = threading.Thread(target=lambda: answers.append(shared.get("longest", longest)), daemon=True)
    worker.start()
    worker.join(10)
    assert answers == [6], "a value made from another must not wait for itself"
    assert shared.get("longest", longest) == 6 and shared.get("tokenizer", tokenizer) == {"hello": 0, "world!": 1}
    assert made == ["longest", "tokenizer"]


def test_run_each_stops_only_the_records_that_fail(frame_conf, tmp_path):
    # The server prepares the requests waiting as one group; one bad request must fail alone.
    cfg = with_stages(frame_conf, {"read_numbers": {}, "scale": {"factor": 3}})
    pipeline = build_pipeline(cfg)
    (tmp_path / "one.txt").write_text("2\n")
    (tmp_path / "two.txt").write_text("5\n")
    (tmp_path / "many.txt").write_text("1 2\n")
    results = pipeline.run_each([{"input": str(tmp_path / "one.txt")}, {"input": str(tmp_path / "gone.txt")},
                                 {"input": str(tmp_path / "many.txt")}, {"input": str(tmp_path / "two.txt")}])
    assert [r["number"] for r in (results[0], results[3])] == [6.0, 15.0]
    assert isinstance(results[1], InputError) and "gone.txt does not exist" in str(results[1])
    assert isinstance(results[2], ValueError)  # two records out of one: not a stage a server's head may hold
