"""Servers for the load and fault tests: the tiny random Llama (fast, greedy answers that depend only on
the prompt), served under different limits. The checkpoint's architecture is the fault-injecting
`FaultyLlamaForCausalLM` (tests/reliability/faulty_llama.py): it behaves as the Llama unless a step's
input holds its fault token, which ordinary text never produces."""
import pytest

from tests.reliability.models import overrides, text_llama
from tests.server_process import server_process

PLUGIN = "plugins=[tests.reliability.faulty_llama]"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return text_llama(tmp_path_factory.mktemp("reliability_llama"), architecture="FaultyLlamaForCausalLM")


@pytest.fixture(scope="session")
def storm_server(tiny_model, tmp_path_factory):
    """Room for everything: 64 sequences at once, a queue of 256."""
    with server_process(*overrides(tiny_model, PLUGIN, "engine.max_num_seqs=64"),
                        cwd=tmp_path_factory.mktemp("storm")) as server:
        yield server
