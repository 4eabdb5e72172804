"""`make demo` on a fresh clone says what it does before each long, silent step (`make -n`: nothing runs)."""
import shutil
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_demo_announces_the_install_and_each_step_before_running_it(tmp_path):
    venv = tmp_path / "venv"  # absent: make plans every step, as on a fresh clone
    plan = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.splitlines()

    def first(fragment):
        return next(i for i, line in enumerate(plan) if fragment in line)

    install = first("pip install --quiet -e .")
    said = [line for line in plan[:install] if line.startswith("echo ")]
    assert any("installing appliance" in line for line in said), plan
    assert any("minutes" in line and "silent" in line for line in said), plan  # how long, and that pip is quiet
    flood, chat = first("appliance run pipeline=prithvi_flood"), first("appliance run pipeline=llava_chat")
    assert install < first("demo 1/2: flood-map the bundled sample scene") < flood, plan
    assert flood < first("demo 2/2: ask the embedded tiny LLaVA") < chat, plan


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_test_installs_chromium_for_the_browser_tests_before_running_them(tmp_path):
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-n", "test", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    extras, chromium, pytest_run = (plan.index("pip install --quiet -e '.[test]'"),
                                    plan.index("apt-get install -y -qq chromium"), plan.index("-m pytest"))
    assert extras < chromium < pytest_run
    assert "[ ! -x /usr/bin/chromium ]" in plan and "DEBIAN_FRONTEND=noninteractive" in plan


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_test_runs_the_static_gate_after_installing_it_and_before_the_tests(tmp_path):
    venv = tmp_path / "venv"
    plan = subprocess.run(["make", "-n", "test", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    extras, ruff, mypy, pytest_run = (plan.index("pip install --quiet -e '.[test]'"),
                                      plan.index(f"{venv}/bin/ruff check"), plan.index(f"{venv}/bin/mypy appliance"),
                                      plan.index("-m pytest"))
    assert extras < ruff < mypy < pytest_run
