"""benchmarks/real_scale.py at toy shapes: it builds llava-hf's layout (loadable by both engines, the
tokenizer fitting the config) and a terratorch-layout flood checkpoint, and measures each run."""
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_real_scale_quick_at_toy_shapes(tmp_path):
    script = REPO / "benchmarks" / "real_scale.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path), "--shape", "tiny", "--quick",
                             "--runs", "ours,transformers,flood"], capture_output=True, text=True,
                            timeout=900, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed:" not in result.stdout, result.stdout
    runs = {line.split(":", 1)[0]: json.loads(line.split(": ", 1)[1].rsplit(" (", 1)[0])
            for line in result.stderr.splitlines() if line.startswith(("ours:", "transformers:", "flood:"))}
    from appliance.engine.host import Host

    # The bf16 checkpoint under engine.dtype=auto: bf16 where the CPU has bf16 units, else fp32 (it fits).
    assert runs["ours"]["dtype"] == runs["flood"]["dtype"] == ("bfloat16" if Host.read().native_bf16 else "float32")
    assert runs["ours"]["tok_s_8"] > 0 and runs["ours"]["ttft_s"] > 0 and runs["transformers"]["decode_ms"] > 0
    assert runs["flood"]["tiles"] >= 1 and runs["flood"]["tiles_s"] > 0
    config = json.loads((tmp_path / "tiny" / "llava" / "config.json").read_text())
    index = json.loads((tmp_path / "tiny" / "llava" / "model.safetensors.index.json").read_text())
    assert config["text_config"]["vocab_size"] == 32064
    assert "language_model.model.embed_tokens.weight" in index["weight_map"]
    assert "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight" in index["weight_map"]
