"""values.schema.json: mistakes fail `helm template` with Helm's message naming the key; every object
level is closed; values.yaml documents every key the schema has."""
import json
import re

import helm_python
import pytest
import yaml

from appliance.field_rules import field_rule
from appliance.config.schema import ServerConfig
from scripts.helm_schema_defs import RULE_WORDS, SETTINGS, main as schema_defs, search_schema
from tests.helm.conftest import CHART, render_files

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


@pytest.mark.parametrize("values, where, message", [
    ({"replicas": 3}, "at ''", "additional properties 'replicas' not allowed"),  # misspelt top-level key
    ({"replicaCount": "3"}, "at '/replicaCount'", "got string, want integer"),
    ({"mode": "job"}, "at '/mode'", "value must be one of 'serve', 'batch'"),
    ({"gpu": {"count": -1}}, "at '/gpu/count'", "minimum: got -1, want 0"),
    ({"overrides": "engine.tensor_parallel_size=2"}, "at '/overrides'", "got string, want array"),
    ({"overrides": [2]}, "at '/overrides/0'", "got number, want string"),
    ({"server": {"apiKey": {"secret": "s"}}}, "at '/server/apiKey'", "additional properties 'secret' not allowed"),
    ({"securityContext": {"readOnlyRootFileSystem": True}}, "at '/securityContext'",
     "additional properties 'readOnlyRootFileSystem' not allowed"),
    ({"resources": {"limit": {"cpu": 1}}}, "at '/resources'", "additional properties 'limit' not allowed"),
    ({"extraConfig": {"pipelines/x.yaml": "a: 1"}}, "at '/extraConfig'", "additional properties 'pipelines/x.yaml'"),
    ({"batch": {"inputs": ["/abs/a.tif"]}}, "at '/batch/inputs/0'", "does not match pattern"),
    ({"autoscaling": {"metric": "gpu"}}, "at '/autoscaling/metric'", "value must be one of"),
    ({"batch": {"search": {"bboxx": [0, 0, 1, 1]}}}, "at '/batch/search'", "additional properties 'bboxx'"),
    ({"batch": {"search": {"max_items": "10"}}}, "at '/batch/search/max_items'", "got string, want integer"),
    ({"batch": {"search": {"shares": 3}}}, "at '/batch/search'", "additional properties 'shares' not allowed"),
    ({"batch": {"search": {"url": 'https://a/"b'}}}, "at '/batch/search/url'", "does not match pattern"),
    ({"batch": {"search": {"collections": ["${oc.env:X}"]}}}, "at '/batch/search/collections/0'",
     "does not match pattern"),
    ({"ingress": {"host": "a.example.com"}}, "at '/ingress'", "additional properties 'host' not allowed"),
    ({"ingress": {"path": "appliance"}}, "at '/ingress/path'", "does not match pattern"),
    ({"ingress": {"path": "/appliance/"}}, "at '/ingress/path'", "does not match pattern"),
    ({"ingress": {"path": "/app(.*)"}}, "at '/ingress/path'", "does not match pattern"),
    ({"ingress": {"hosts": ["https://a.example.com"]}}, "at '/ingress/hosts/0'", "does not match pattern"),
    ({"ingress": {"hosts": [{"host": "a.example.com", "paths": [{"path": "/v1"}]}]}}, "at '/ingress/hosts/0'",
     "got object, want string"),
    ({"server": {"s3": {"allowedBuckets": ["s3://hls"]}}}, "at '/server/s3/allowedBuckets/0'",
     "does not match pattern"),
    ({"server": {"s3": {"allowedBuckets": "hls"}}}, "at '/server/s3/allowedBuckets'", "got string, want array"),
    ({"server": {"corsOrigins": ["https://app.example.com/"]}}, "at '/server/corsOrigins/0'",
     "does not match pattern"),
    ({"server": {"corsOrigins": "https://app.example.com"}}, "at '/server/corsOrigins'", "got string, want array"),
])
def test_mistakes_are_refused_naming_the_key(chart, values, where, message):
    with pytest.raises(helm_python.HelmValuesError) as refused:
        render_files(chart, values)
    assert where in str(refused.value) and message in str(refused.value), str(refused.value)


def objects(node, path="#"):
    """Every schema node that describes an object, with its JSON pointer."""
    if isinstance(node, dict):
        types = node.get("type", [])
        if "object" in (types if isinstance(types, list) else [types]) or "properties" in node:
            yield path, node
        for key, value in node.items():
            yield from objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from objects(value, f"{path}/{i}")


def test_every_object_level_is_closed():
    found = list(objects(SCHEMA))
    assert len(found) > 40
    for path, node in found:
        assert node.get("additionalProperties") is False, path


def test_the_kubernetes_defs_and_the_settings_rules_are_up_to_date():
    assert schema_defs(["--check"]) == 0, "run python scripts/helm_schema_defs.py"


@pytest.mark.parametrize("path, name", SETTINGS)
def test_values_that_become_settings_carry_the_settings_rules(path, name):
    """The chart refuses what the server would: the same words as the field's rule, and no others."""
    node = SCHEMA
    for part in path:
        node = node["properties"][part]
    node = node.get("items", node)
    words = field_rule(ServerConfig, name).json_schema()
    assert words and {word: node[word] for word in node if word in RULE_WORDS} == words


@pytest.mark.parametrize("values, where", [
    ({"server": {"port": 0}}, "at '/server/port'"),
    ({"server": {"drainTimeoutSeconds": -1}}, "at '/server/drainTimeoutSeconds'"),
    ({"metrics": {"names": "prometheus"}}, "at '/metrics/names'"),
])
def test_a_value_outside_its_settings_rule_fails_helm_template(chart, values, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render_files(chart, values)


def schema_keys(node, prefix=""):
    for key, sub in node.get("properties", {}).items():
        yield prefix + key
        yield from schema_keys(sub, f"{prefix}{key}.")


def test_values_yaml_documents_every_key():
    """Each key of the schema is in values.yaml with a comment above it; batch.search's keys, SearchConfig's
    (documented on its fields and in docs/geo.md), are named in the comment above `search:`."""
    search = {f"batch.search.{key}" for key in search_schema()["properties"]}
    comment = re.search(r"((?:\n  #.*)+)\n  search:", (CHART / "values.yaml").read_text()).group(1)
    assert all(re.search(rf"\b{key.rsplit('.', 1)[1]}\b", comment) for key in search), comment
    keys = set(schema_keys(SCHEMA)) - search
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented, previous = set(), ""
    stack = []  # (indent, key)
    for line in lines:
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if match:
            indent, key = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key))
            path = ".".join(k for _, k in stack)
            if path in keys:  # not the fields of a Kubernetes object (podSecurityContext.runAsUser, ...)
                assert previous.lstrip().startswith("#"), f"values.yaml: {path} has no comment above it"
                documented.add(path)
        if line.strip():
            previous = line
    assert documented == keys


def test_values_yaml_is_what_helm_merges(chart):
    """The defaults render on their own (the schema applies to them too)."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["mode"] == "serve"
    assert render_files(chart, {})
