"""Write the derived parts of helm/appliance/values.schema.json: its `$defs`, and the rules of the values
that become server settings.

Settings: `server.port`, `server.corsOrigins`, `server.drainTimeoutSeconds` and `metrics.names` reach the
server as its `server.*` settings, so their minimum, maximum, enum and pattern are those settings' rules,
read from the schema fields (appliance/field_rules.py), never written by hand.

`batch.search` holds `appliance run`'s `search.*` keys (SearchConfig): its properties are the schema
fields', each with its type and rule, strings kept free of what Hydra's double quotes cannot hold; the
chart sets `shares` (batch.parallelism) and each pod its `share` ($JOB_COMPLETION_INDEX), so those two
are not values.

The chart passes a few values straight into the pod spec (`podSecurityContext`, `securityContext`,
`resources`, `tolerations`, `affinity`, `imagePullSecrets`). Their schemas are Kubernetes 1.33's own
(the strict JSON schemas kubernetes-validate ships), copied with every `$ref` they reach, minus
descriptions and `x-kubernetes-*` annotations, so that a misspelt field there fails `helm template`
too. Kubernetes maps (`resources.limits`, `matchLabels`) become `patternProperties` on a qualified-name
key with `additionalProperties: false`, as every object in the values schema is.

    python scripts/helm_schema_defs.py          # rewrite the file's $defs and the settings' rules
    python scripts/helm_schema_defs.py --check  # exit 1 when the file is out of date

tests/helm/test_values_schema.py runs the check.
"""
import copy
import json
import re
import sys
from pathlib import Path

import dataclasses
import typing

from appliance.field_rules import field_rule
from appliance.config.schema import SearchConfig, ServerConfig

KUBERNETES = "1.33"
SCHEMA = Path(__file__).resolve().parents[1] / "helm" / "appliance" / "values.schema.json"
ROOTS = ["io.k8s.api.core.v1.PodSecurityContext", "io.k8s.api.core.v1.SecurityContext",
         "io.k8s.api.core.v1.ResourceRequirements", "io.k8s.api.core.v1.Toleration",
         "io.k8s.api.core.v1.Affinity", "io.k8s.api.core.v1.LocalObjectReference"]
# A label key or resource name: an optional DNS-subdomain prefix and "/", then a name.
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

# A chart value that becomes a server setting: its path in the values, and the ServerConfig field it sets.
SETTINGS = [(("server", "port"), "port"), (("server", "corsOrigins"), "cors_origins"),
            (("server", "drainTimeoutSeconds"), "drain_timeout_s"), (("metrics", "names"), "metrics_names")]
RULE_WORDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "enum", "pattern")


def with_settings_rules(schema: dict) -> dict:
    """`schema` with each SETTINGS value's rule words replaced by its field's rule (on an array: its items')."""
    out = copy.deepcopy(schema)
    for path, name in SETTINGS:
        node = out
        for part in path:
            node = node["properties"][part]
        if node.get("type") == "array":
            node = node["items"]
        for word in RULE_WORDS:
            node.pop(word, None)
        node.update(field_rule(ServerConfig, name).json_schema())
    return out


SEARCH = ("batch", "search")
CHART_SETS = ("shares", "share")  # SearchConfig fields the chart derives
HYDRA_QUOTABLE = "^[^\"\\\\$\\r\\n]+$"  # no double quote, backslash, `$` or line break


def search_schema() -> dict:
    """batch.search's schema: SearchConfig's fields (CHART_SETS aside), each typed, with its rule."""
    properties = {}
    hints = typing.get_type_hints(SearchConfig)
    for f in dataclasses.fields(SearchConfig):
        if f.name in CHART_SETS:
            continue
        node = _json_type(hints[f.name])
        found = field_rule(SearchConfig, f.name)
        if found is not None:
            (node["items"] if node["type"] == "array" else node).update(found.json_schema())
        properties[f.name] = node
    return {"type": "object", "additionalProperties": False, "properties": properties}


def _json_type(annotation) -> dict:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union:
        return _json_type(args[0])
    if typing.get_origin(annotation) is list:
        return {"type": "array", "items": _json_type(args[0])}
    words = {str: {"type": "string", "pattern": HYDRA_QUOTABLE}, int: {"type": "integer"}, float: {"type": "number"}}
    return dict(words[annotation])


def with_search(schema: dict) -> dict:
    out = copy.deepcopy(schema)
    node = out
    for part in SEARCH[:-1]:
        node = node["properties"][part]
    node["properties"][SEARCH[-1]] = search_schema()
    return out


def kubernetes_definitions() -> dict:
    import importlib.resources

    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    return json.loads((folder / f"v{KUBERNETES}.0-local-strict" / "_definitions.json").read_text())["$defs"]


def k8s_defs() -> dict:
    """ROOTS and every definition they reference, cleaned as the module docstring says."""
    definitions, picked = kubernetes_definitions(), {}

    def visit(name: str) -> None:
        if name not in picked:
            picked[name] = definitions[name]
            for ref in re.findall(r'"#/\$defs/([\w.-]+)"', json.dumps(definitions[name])):
                visit(ref)

    for root in ROOTS:
        visit(root)
    return {name: _clean(picked[name]) for name in sorted(picked)}


def _clean(node):
    if isinstance(node, list):
        return [_clean(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _clean(value) for key, value in node.items()
           if key != "description" and not key.startswith("x-kubernetes-")}
    if isinstance(out.get("additionalProperties"), dict):  # a map
        out["patternProperties"] = {QUALIFIED_NAME: out.pop("additionalProperties")}
        out["additionalProperties"] = False
    return out


def main(argv) -> int:
    schema = json.loads(SCHEMA.read_text())
    fresh = with_search(with_settings_rules({**schema, "$defs": k8s_defs()}))
    if "--check" in argv:
        if schema != fresh:
            print(f"{SCHEMA}: $defs differ from Kubernetes {KUBERNETES}'s, a setting's rule from its schema "
                  f"field's, or batch.search from SearchConfig; run python {__file__}", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(json.dumps(fresh, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
