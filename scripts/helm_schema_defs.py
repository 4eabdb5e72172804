"""Write the Kubernetes part of helm/appliance/values.schema.json: its `$defs`.

The chart passes a few values straight into the pod spec (`podSecurityContext`, `securityContext`,
`resources`, `tolerations`, `affinity`, `imagePullSecrets`). Their schemas are Kubernetes 1.33's own
(the strict JSON schemas kubernetes-validate ships), copied with every `$ref` they reach, minus
descriptions and `x-kubernetes-*` annotations, so that a misspelt field there fails `helm template`
too. Kubernetes maps (`resources.limits`, `matchLabels`) become `patternProperties` on a qualified-name
key with `additionalProperties: false`, as every object in the values schema is.

    python scripts/helm_schema_defs.py          # rewrite the file's $defs
    python scripts/helm_schema_defs.py --check  # exit 1 when the file is out of date

tests/helm/test_values_schema.py runs the check.
"""
import json
import re
import sys
from pathlib import Path

KUBERNETES = "1.33"
SCHEMA = Path(__file__).resolve().parents[1] / "helm" / "appliance" / "values.schema.json"
ROOTS = ["io.k8s.api.core.v1.PodSecurityContext", "io.k8s.api.core.v1.SecurityContext",
         "io.k8s.api.core.v1.ResourceRequirements", "io.k8s.api.core.v1.Toleration",
         "io.k8s.api.core.v1.Affinity", "io.k8s.api.core.v1.LocalObjectReference"]
# A label key or resource name: an optional DNS-subdomain prefix and "/", then a name.
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


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
    fresh = k8s_defs()
    if "--check" in argv:
        if schema.get("$defs") != fresh:
            print(f"{SCHEMA}: $defs differ from Kubernetes {KUBERNETES}'s; run python {__file__}", file=sys.stderr)
            return 1
        return 0
    schema["$defs"] = fresh
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
