"""The Dockerfile agrees with the chart and the package (no docker engine here: read, not built)."""
import re

import yaml

from tests.helm.conftest import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions():
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    kept = "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#"))
    text = re.sub(r"\\\n", " ", kept)
    return [tuple(line.split(None, 1)) for line in text.splitlines() if line.strip()]


def test_kernels_are_built_after_the_package_is_installed():
    runs = [args for op, args in instructions() if op == "RUN"]
    install = next(i for i, args in enumerate(runs) if "pip install /src" in args)
    build = next(i for i, args in enumerate(runs) if "python -m appliance.engine.build_kernels" in args)
    assert install < build
    env = " ".join(args for op, args in instructions() if op == "ENV")
    assert "XDG_CACHE_HOME=/opt/appliance/cache" in env, "built into a cache the chart leaves in place"


def test_torch_is_the_packages_pin_from_the_variants_index():
    (torch,) = re.findall(r'"torch==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert f"ARG TORCH_VERSION={torch}" in DOCKERFILE
    assert re.search(r"cpu\) index=.*cuda\) index=", DOCKERFILE, re.S)


def test_the_image_runs_as_the_charts_user_on_its_port():
    user = next(args for op, args in instructions() if op == "USER")
    assert user == f"{VALUES['podSecurityContext']['runAsUser']}:{VALUES['podSecurityContext']['runAsGroup']}"
    assert next(args for op, args in instructions() if op == "EXPOSE") == str(VALUES["server"]["port"])
    assert "APPLIANCE_CONF_DIR=/opt/appliance/conf" in DOCKERFILE
    assert 'cp -r /src/conf "$APPLIANCE_CONF_DIR"' in DOCKERFILE


def test_the_build_context_keeps_what_the_install_needs():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not ignored & {"appliance", "conf", "pyproject.toml", "README.md"}


def test_the_charts_default_tags_are_the_documented_builds():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert VALUES["image"]["repository"] == "appliance" and VALUES["image"]["tag"] == ""
    assert f"appliance:{chart['appVersion']} ." in DOCKERFILE
    assert f"appliance:{chart['appVersion']}-cuda --build-arg VARIANT=cuda ." in DOCKERFILE
