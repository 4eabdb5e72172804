"""Rules declared on schema fields (appliance/field_rules.py): each kind refuses with its one line,
every numeric server and engine setting declares a rule or says why it has none, and the docs' ranges
are the fields' rules."""
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, get_args

import pytest

from appliance.field_rules import RULE, UNBOUNDED, Rule, check_fields, nested_schema, rule
from appliance.config.schema import EngineConfig, ServerConfig
from appliance.errors import ConfigError
from tests.conftest import assert_user_error, run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"


@dataclass
class Inner:
    size: int = field(default=1, metadata=rule(ge=1))


@dataclass
class Sample:
    count: int = field(default=1, metadata=rule(ge=1, why="items per step"))
    ratio: float = field(default=0.5, metadata=rule(gt=0, lt=1))
    port: int = field(default=80, metadata=rule(ge=1, le=65535))
    cap: float = field(default=1.0, metadata=rule(le=2))
    mode: str = field(default="a", metadata=rule(choices=("a", "b")))
    origins: List[str] = field(default_factory=list, metadata=rule(pattern=r"https?://\w+", why="an origin"))
    budget: Optional[int] = field(default=None, metadata=rule(ge=0))
    inner: Inner = field(default_factory=Inner)
    low: int = 0
    high: int = 9

    def verify(self) -> None:
        if self.low > self.high:
            raise ConfigError(f"sample.low={self.low} is above sample.high={self.high}")


@pytest.mark.parametrize("change, line", [
    ({"count": 0}, "sample.count: 0; allowed: 1 or more (items per step)"),
    ({"ratio": 0.0}, "sample.ratio: 0; allowed: more than 0, less than 1"),
    ({"ratio": 1.5}, "sample.ratio: 1.5; allowed: more than 0, less than 1"),
    ({"port": 70000}, "sample.port: 70000; allowed: 1 to 65535"),
    ({"cap": 2.5}, "sample.cap: 2.5; allowed: 2 or less"),
    ({"mode": "c"}, "sample.mode: 'c'; allowed: a, b"),
    ({"origins": ["https://ok", "ftp://no"]}, "sample.origins: 'ftp://no'; allowed: an origin"),
    ({"budget": -1}, "sample.budget: -1; allowed: 0 or more"),
    ({"inner": Inner(size=0)}, "sample.inner.size: 0; allowed: 1 or more"),
    ({"low": 10}, "sample.low=10 is above sample.high=9"),
])
def test_each_rule_kind_refuses_with_its_line(change, line):
    with pytest.raises(ConfigError) as refused:
        check_fields(Sample(**change), Sample, "sample.")
    assert str(refused.value) == line


def test_values_within_the_rules_pass_and_none_is_unset():
    check_fields(Sample(count=5, ratio=0.99, port=65535, cap=2, mode="b", origins=["http://x"], budget=0),
                 Sample, "sample.")


def test_the_error_names_its_setting():
    with pytest.raises(ConfigError) as refused:
        check_fields(Sample(port=0), Sample, "sample.")
    assert refused.value.param == "sample.port"


def test_a_rule_declares_something_and_a_pattern_says_what_it_wants():
    with pytest.raises(TypeError, match="needs `why`"):
        Rule(pattern="a+")
    with pytest.raises(TypeError, match="declares a bound"):
        Rule(why="anything")


@pytest.mark.parametrize("found, words", [
    (Rule(ge=1, le=65535), {"minimum": 1, "maximum": 65535}),
    (Rule(gt=0.5), {"exclusiveMinimum": 0.5}),
    (Rule(choices=("a", "b")), {"enum": ["a", "b"]}),
    (Rule(pattern=r"\*|x", why="x or *"), {"pattern": r"^(\*|x)$"}),
])
def test_json_schema_words(found, words):
    assert found.json_schema() == words


def numeric_fields(schema: type, prefix: str):
    for f in dataclasses.fields(schema):
        nested = nested_schema(f.type)
        if nested is not None:
            yield from numeric_fields(nested, f"{prefix}{f.name}.")
        elif {int, float} & ({f.type} | set(get_args(f.type))):
            yield f"{prefix}{f.name}", f


def test_every_numeric_server_and_engine_field_has_a_rule_or_says_why_not():
    found = dict(numeric_fields(ServerConfig, "server.")) | dict(numeric_fields(EngineConfig, "engine."))
    assert "server.scenes.keep_s" in found and "engine.block_size" in found
    bare = [key for key, f in found.items() if RULE not in f.metadata and not f.metadata.get(UNBOUNDED)]
    assert not bare, f"declare a rule (field_rules.rule) or unbounded(why) on: {bare}"


def test_a_device_torch_does_not_know_is_refused_by_check():
    result = run_cli("check", "pipeline=llava_chat", "engine.device=gpu")
    assert_user_error(result, "engine.device: 'gpu'; allowed: cpu, cuda or cuda:N")


def test_engine_config_is_checked_however_it_is_built():
    with pytest.raises(ConfigError, match=r"^engine\.block_size: 0; allowed: 1 or more"):
        EngineConfig(block_size=0)
    with pytest.raises(ConfigError, match="engine.quantization=int8 applies to a language model"):
        EngineConfig(kind="pool", quantization="int8")


# A documented range: "`server.stream_interval` (1, ...; allowed: 1 or more)", the text the error shows.
DOCUMENTED = re.compile(r"`((?:server|engine)\.[\w.]+)` \([^()]*?; allowed: ([^()]+)\)")


def rule_of(key: str) -> Rule:
    group, *path = key.split(".")
    schema = {"server": ServerConfig, "engine": EngineConfig}[group]
    for name in path[:-1]:
        schema = nested_schema({f.name: f.type for f in dataclasses.fields(schema)}[name])
    return {f.name: f for f in dataclasses.fields(schema)}[path[-1]].metadata[RULE]


def test_documented_ranges_are_the_fields_rules():
    documented = []
    for doc in ("serving.md", "engine.md"):
        text = re.sub(r"\s+", " ", (DOCS / doc).read_text())
        documented += DOCUMENTED.findall(text)
    keys = {key for key, _ in documented}
    assert {"server.stream_interval", "server.scenes.keep_s", "engine.block_size"} <= keys, keys
    for key, allowed in documented:
        assert allowed == rule_of(key).allowed(), f"docs give {key} as {allowed!r}"
