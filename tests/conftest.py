import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FRAME_CONF = REPO / "tests" / "frame" / "conf"


@contextmanager
def one_torch_thread():
    """torch on one thread, then back: 2 OpenMP threads on 2 shared cores stall each other on tiny ops."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_cli(*args, conf_dir=None, cwd=None, timeout=300, env=None):
    """Run `python -m appliance.cli ARGS` as a user would; returns the CompletedProcess."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # keep carried packages
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    full_env.pop("APPLIANCE_CONF_DIR", None)
    if conf_dir is not None:
        full_env["APPLIANCE_CONF_DIR"] = str(conf_dir)
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd or REPO, env=full_env, timeout=timeout,
    )


def assert_user_error(result, *fragments):
    """Exit 2, exactly one line on stderr naming every fragment, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def assert_config_error(overrides, *fragments):
    """Composing `overrides` fails with one ConfigError line naming every fragment."""
    from appliance.config.compose import compose
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose(overrides)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.fixture
def frame_conf(monkeypatch):
    monkeypatch.setenv("APPLIANCE_CONF_DIR", str(FRAME_CONF))
    return FRAME_CONF


# Prithvi's architecture at toy size, for tests that exercise the pipeline rather than the model.
TINY_PRITHVI = ["model.prithvi.embed_dim=32", "model.prithvi.depth=2", "model.prithvi.num_heads=2",
                "model.prithvi.selected_indices=[0,1,1,1]", "model.prithvi.decoder_channels=16",
                "model.prithvi.coords_encoding=[]", "model.prithvi.coords_scale_learn=false"]


@pytest.fixture(scope="session")
def tiny_prithvi_checkpoint(tmp_path_factory):
    """Random weights of TINY_PRITHVI saved as our safetensors checkpoint."""
    import torch

    from appliance.config.compose import compose
    from appliance.engine.models.prithvi import build_prithvi_segmentation, save_safetensors

    cfg = compose(["pipeline=prithvi_flood", *TINY_PRITHVI])
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands))
    path = tmp_path_factory.mktemp("prithvi") / "tiny.safetensors"
    save_safetensors(model, path)
    return path
