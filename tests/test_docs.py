"""The docs' command and code blocks, run as a reader would run them.

- Every `appliance config` and `appliance check` line of README.md's and docs/*.md's shell blocks, its
  arguments split as the shell splits them, run through the CLI's `main` from a checkout-like directory;
  files it names that a reader would have downloaded stand in as bundled ones (`model.path`: the tiny
  LLaVA's folder; `model.checkpoint`: an empty file of that name, which `check` does not read; `input`:
  the bundled sample of that kind; `search.url`: the tests' STAC API, tests/geo/test_stac_search.py's
  synthetic catalog).
- README's Python and curl client examples against real servers: the chat ones against the shared
  tiny-LLaVA server (tests/servers.py, `pipeline=llava_chat` as README starts it), the flood ones
  against a server started from README's own `appliance serve pipeline=prithvi_flood ...` line. An
  example whose last line says what it prints (`print(...)   # "..."`) must print exactly that.

Not run, and why: `appliance run` and `appliance serve` lines (NOT_RUN below); install steps (`make`,
`pip`, `python3 -m venv`: the test environment is what they make); `hf download` (the network);
`helm`, `kubectl`, `docker` (a cluster, an image); docs/*.md's Python fragments (parts of a module,
not programs).
"""
import json
import re
import shlex
import shutil
import subprocess

import numpy as np
import torch
import pytest
import rasterio

from appliance.cli import main
from tests.conftest import REPO
from tests.geo.conftest import stac_catalog  # noqa: F401  (the STAC API a docs' search line is checked against)
from tests.server_process import server_process
from tests.servers import LLAVA_TINY, SAMPLE_IMAGE, SAMPLE_SCENE

README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
RUN = ("config", "check")
NOT_RUN = {  # verb -> why its lines are not run here
    "run": "runs a model end to end (tests/chat and tests/geo run both pipelines); installs signal handlers",
    "serve": "a long-running server; README's flood line is the server the client examples below use",
    "assemble": "needs the masks of a search's shares (tests/geo/test_region_shares.py runs both)",
}
SHELL = ("bash", "sh", "")
README_PORTS = {"chat": "127.0.0.1:8000", "flood": "127.0.0.1:8001"}


def fenced_blocks(path):
    """(language, text) of each top-level ``` block, `\\`-continued lines joined."""
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", path.read_text(), re.M | re.S):
        yield match.group(1), match.group(2).replace("\\\n", " ")


def appliance_lines():
    """(where, argv) for every `appliance VERB ...` line of the docs' shell blocks."""
    for path in DOCS:
        for number, (language, text) in enumerate(fenced_blocks(path)):
            if language in SHELL:
                for line in text.splitlines():
                    line = line.strip().removeprefix("$ ")
                    if line.startswith("appliance "):
                        yield f"{path.name} block {number}", shlex.split(line, comments=True)[1:]


COMMANDS = list(appliance_lines())


def test_the_docs_have_commands_to_run_and_every_verb_is_known():
    verbs = [argv[0] for _, argv in COMMANDS]
    assert verbs.count("check") >= 3 and "config" in verbs
    assert set(verbs) <= set(RUN) | set(NOT_RUN), verbs


def stand_ins(argv, tmp_path, request):
    """argv with the files a reader would have downloaded replaced by bundled ones."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "search.url":
            arg = f"{key}={request.getfixturevalue('stac_catalog').api_url}"
        elif key == "model.path" and not (REPO / value).is_dir():
            arg = f"{key}={LLAVA_TINY}"
        elif key == "model.checkpoint" and not (REPO / value).is_file():
            stand_in = tmp_path / value.rsplit("/", 1)[-1]
            torch.save({"weight": torch.zeros(1)}, stand_in)  # a checkpoint `check` can read and size
            arg = f"{key}={stand_in}"
        elif key == "input" and not (REPO / value).exists():
            arg = f"{key}={SAMPLE_SCENE if value.endswith(('.tif', '.tiff')) else SAMPLE_IMAGE}"
        out.append(arg)
    return out


@pytest.mark.parametrize("where,argv", [c for c in COMMANDS if c[1][0] in RUN],
                         ids=lambda case: case if isinstance(case, str) else " ".join(case)[:60])
def test_config_and_check_lines_work_as_written(where, argv, tmp_path, monkeypatch, capsys, request):
    monkeypatch.chdir(REPO)  # the docs' relative paths are the repository's
    code = main(stand_ins(argv, tmp_path, request))
    out, err = capsys.readouterr()
    assert code == 0, f"{where}: appliance {' '.join(argv)}\n{err}"
    if argv[0] == "check":
        assert out.splitlines()[-1].startswith("ok: pipeline "), out
        assert all(line.startswith(("run ", "skip ", "search: ")) for line in out.splitlines()[:-1]), out
    else:
        assert "pipeline:" in out and "model:" in out


# --- README's client examples against real servers -------------------------------------------------

def readme_blocks(language):
    return [text for lang, text in fenced_blocks(README) if lang == language]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A working directory like the repository root (the examples read `appliance/assets/...`), whose
    outputs (`mask.tif`) stay out of the repository."""
    root = tmp_path_factory.mktemp("readme")
    (root / "appliance").symlink_to(REPO / "appliance")
    return root


@pytest.fixture(scope="module")
def readme_flood_server(checkout):
    """The server of README's `/v1/pool` example, started by the block's own `appliance serve` line."""
    (block,) = [b for b in readme_blocks("bash") if "/v1/pool" in b]
    (line,) = [shlex.split(line)[2:] for line in block.splitlines() if line.startswith("appliance serve ")]
    with server_process(*[arg for arg in line if not arg.startswith("server.port=")], cwd=checkout) as server:
        yield server


def against(text, llava_server, flood_server):
    for kind, server in (("chat", llava_server), ("flood", flood_server)):
        text = text.replace(f"http://{README_PORTS[kind]}", server.base)
    return text


def assert_flood_mask(path):
    with rasterio.open(SAMPLE_SCENE) as scene, rasterio.open(path) as mask:
        assert (mask.width, mask.height, mask.crs, mask.dtypes) == (scene.width, scene.height, scene.crs, ("uint8",))
        values = set(np.unique(mask.read(1)).tolist())
        assert values <= {0, 1, 255} and 1 in values, values  # the sample scene has water


@pytest.mark.slow
def test_readme_python_examples_print_what_they_say(llava_server, readme_flood_server, checkout, monkeypatch,
                                                     capsys):
    monkeypatch.chdir(checkout)
    blocks = readme_blocks("python")
    assert len(blocks) == 2 and all(any(p in b for p in README_PORTS.values()) for b in blocks)
    for number, block in enumerate(blocks):
        (checkout / "mask.tif").unlink(missing_ok=True)
        exec(compile(against(block, llava_server, readme_flood_server), f"README.md python block {number}",
                     "exec"), {"__name__": "readme_example"})
        printed = capsys.readouterr().out
        said = re.search(r'^print\(.*\)\s*#\s*"(.*)"$', block, re.M)
        if said:
            assert printed == said.group(1) + "\n", (block, printed)
        if "mask.tif" in block:
            assert_flood_mask(checkout / "mask.tif")


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("base64")), reason="needs curl and base64")
def test_readme_curl_examples_answer(llava_server, readme_flood_server, checkout):
    blocks = [b for b in readme_blocks("bash") if "curl " in b and "helm" not in b]
    assert len(blocks) == 2
    for block in blocks:
        (checkout / "mask.tif").unlink(missing_ok=True)
        script = "\n".join(line for line in block.splitlines() if not line.startswith("appliance serve"))
        result = subprocess.run(["bash", "-ec", against(script, llava_server, readme_flood_server)], cwd=checkout,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        if "-o mask.tif" in block:
            assert_flood_mask(checkout / "mask.tif")
        else:
            assert "orange" in json.loads(result.stdout)["choices"][0]["message"]["content"], result.stdout
