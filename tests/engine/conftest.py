"""Tiny random Llama checkpoints (+ a byte-level BPE tokenizer) and shared parity helpers."""
import pytest
import torch

from appliance.engine import cpu_kernels
from tests.conftest import one_torch_thread
from tests.engine.helpers import build_checkpoint


@pytest.fixture(params=[True, False], ids=["our_cpu_kernels", "torch_kernels"])
def kernels(request):
    """engine.cpu_kernels for parity tests: both paths must match the reference."""
    if request.param and not cpu_kernels.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_kernels.unavailable_reason()}")
    return request.param  # each engine takes it from its own config: nothing to reset


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """GQA Llama (4 heads, 2 KV heads), untied, single safetensors file."""
    return build_checkpoint(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="session")
def sharded_tied_dir(tmp_path_factory):
    """Tied embeddings, saved as several shards with an index.json."""
    return build_checkpoint(tmp_path_factory.mktemp("llama_tied"), tie_word_embeddings=True,
                            max_shard_size="40KB", seed=1)


ROPE_VARIANTS = {
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
}


@pytest.fixture(scope="session", params=sorted(ROPE_VARIANTS))
def rope_scaled_dir(request, tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp(f"llama_rope_{request.param}"), seed=2,
                            max_position_embeddings=256, rope_parameters=ROPE_VARIANTS[request.param])


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
