"""The Helm chart rendered by Helm's own engine (helm-python-sdk: the Helm v4 Go SDK, no helm binary)."""
from pathlib import Path
from typing import Dict, List

import helm_python
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "appliance"
PROFILES = sorted(p.name[: -len("-values.yaml")] for p in (CHART / "ci").glob("*-values.yaml"))
KUBERNETES = "1.33"


def profile_values(profile: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{profile}-values.yaml").read_text()) or {}


@pytest.fixture(scope="session")
def chart():
    return helm_python.Chart.load(CHART)


def render_files(chart, values: dict) -> Dict[str, str]:
    """{template path: text} as `helm template demo helm/appliance -n apps -f values` renders them."""
    return chart.render(values=values, name="demo", namespace="apps")


def manifests(chart, values: dict) -> List[dict]:
    """Every Kubernetes object the values render, NOTES.txt aside."""
    return [doc for path, text in render_files(chart, values).items() if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


ASSEMBLE = "assemble"  # the component of a search's second Job (templates/job-assemble.yaml)


def by_kind(docs: List[dict]) -> Dict[str, dict]:
    """Each object by its kind, one of each; a search's assemble Job as `Job/assemble`, beside the shares'."""
    kinds = {}
    for doc in docs:
        component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        kind = f"{doc['kind']}/{ASSEMBLE}" if component == ASSEMBLE else doc["kind"]
        assert kind not in kinds, f"two {kind}s"
        kinds[kind] = doc
    return kinds


def pod_spec(docs: List[dict]) -> dict:
    kinds = by_kind(docs)
    workload = kinds.get("Deployment") or kinds["Job"]
    return workload["spec"]["template"]["spec"]


def container(docs: List[dict]) -> dict:
    (only,) = pod_spec(docs)["containers"]
    return only


def helm_test_pod(docs: List[dict]) -> dict:
    """The Pod `helm test` runs (templates/tests/check.yaml)."""
    (pod,) = [doc for doc in docs if doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    return pod
