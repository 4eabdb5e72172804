"""dtype auto, the default KV cache size and the refusal of a model that cannot fit (memory_plan.py),
on made-up machines (`Host`), and the machine facts read from /proc text (host.py)."""
import pytest
import torch

from appliance.engine.attention_geometry import AttentionGeometry
from appliance.engine.checkpoint_facts import CheckpointFacts, file_checkpoint_facts, hf_checkpoint_facts
from appliance.engine.config import EngineConfig
from appliance.engine.host import Host, cgroup_room, parse_cpu_flags, parse_meminfo
from appliance.engine.memory_plan import CPU_KV_CAP_BYTES, GIB, RUNTIME_RESERVE_BYTES, auto_dtype_without_host, \
    plan_memory
from appliance.errors import ConfigError
from tests.servers import LLAVA_TINY

AVX2 = frozenset({"avx2", "fma"})
AMX = frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
B7 = 6_900_000_000  # a LLaVA-1.5-7B's weights (elements)
# 512 KiB a token in bf16
LLAVA_7B_KV = AttentionGeometry(num_heads=32, num_kv_heads=32, head_dim=128, block_size=16, num_layers=32)


def host(flags, available_gib, total_gib=None):
    return Host(flags, int(available_gib * GIB), int((total_gib or available_gib) * GIB))


def plan(dtype="auto", ckpt=torch.bfloat16, elements=B7, machine=None, device="cpu", kv=LLAVA_7B_KV,
         max_model_len=4096, **cfg):
    cfg = EngineConfig(dtype=dtype, device=device, **cfg)
    return plan_memory(cfg, CheckpointFacts(ckpt, elements), machine or host(AVX2, 22), "model M", kv, max_model_len)


# (engine.dtype, checkpoint dtype, weights, CPU flags, GiB available, device) -> chosen dtype
DTYPE_CASES = [
    ("auto", torch.float32, B7, AVX2, 40, "cpu", torch.float32),  # fp32 checkpoint: fp32
    ("auto", torch.float32, B7, AMX, 40, "cpu", torch.float32),
    ("auto", torch.bfloat16, B7, AMX, 22, "cpu", torch.bfloat16),  # bf16 units: bf16
    ("auto", torch.float16, B7, ZEN4, 22, "cpu", torch.bfloat16),  # half on CPU means bf16
    ("auto", torch.bfloat16, B7, AVX2, 22, "cpu", torch.bfloat16),  # no units, fp32 (27.6 GB) does not fit
    ("auto", torch.bfloat16, 1_000_000, AVX2, 22, "cpu", torch.float32),  # no units, fp32 fits
    ("auto", torch.float16, B7, AVX2, 60, "cpu", torch.float32),
    ("auto", torch.float16, B7, AVX2, 60, "cuda", torch.float16),  # CUDA: the checkpoint's own
    ("auto", torch.bfloat16, B7, AVX2, 60, "cuda", torch.bfloat16),
    ("float32", torch.bfloat16, 1_000_000, AMX, 22, "cpu", torch.float32),  # explicit wins
    ("bfloat16", torch.float32, 1_000_000, AVX2, 22, "cpu", torch.bfloat16),
]


@pytest.mark.parametrize("requested, ckpt, elements, flags, gib, device, expected", DTYPE_CASES)
def test_dtype_rule(requested, ckpt, elements, flags, gib, device, expected):
    p = plan(requested, ckpt, elements, host(flags, gib), device=device)
    assert p.dtype == expected
    assert p.dtype_reason.startswith("auto" if requested == "auto" else f"engine.dtype={requested}")


@pytest.mark.parametrize("own, device, expected", [
    (torch.float32, "cpu", torch.float32),
    (torch.float64, "cuda", torch.float32),  # wider than fp32: fp32, even on a card
    (torch.float16, "cuda:1", torch.float16),  # a card runs the checkpoint's own half precision
    (torch.bfloat16, "cuda", torch.bfloat16),
    (torch.bfloat16, "cpu", None),  # half precision on CPU: the host's bf16 units decide
    (torch.float16, "cpu", None),
])
def test_what_auto_settles_without_the_host(own, device, expected):
    """The part of the dtype rule the config check applies before the engine reads the host."""
    assert auto_dtype_without_host(own, device) == expected
    if expected is not None:  # and the engine's full rule agrees, on any host
        assert plan(ckpt=own, device=device, elements=1_000_000, machine=host(AVX2, 60)).dtype == expected


def test_the_reason_names_the_units_or_their_absence():
    assert "amx_bf16" in plan(machine=host(AMX, 22)).dtype_reason
    reason = plan(elements=1_000_000, machine=host(AVX2, 22)).dtype_reason
    assert "no bf16 units" in reason and "float32 fits" in reason


def test_cpu_kv_default_is_half_of_what_is_left_capped():
    # 7B bf16 on 22 GiB: 22 - 12.85 - 1 = 8.15 GiB left; half is over the 4 GiB cap.
    assert plan(machine=host(AMX, 22)).kv_cache_memory_bytes == CPU_KV_CAP_BYTES
    # 18 GiB: (18 - 12.85 - 1) / 2 = 2.07 GiB, above one 4096-token sequence (2 GiB).
    p = plan(machine=host(AMX, 18))
    weights = B7 * 2
    assert p.kv_cache_memory_bytes == (18 * GIB - weights - RUNTIME_RESERVE_BYTES) // 2
    assert p.kv_reason.startswith("derived: half")


def test_cpu_kv_default_never_exceeds_what_the_sequences_can_use():
    tiny = AttentionGeometry(num_heads=2, num_kv_heads=2, head_dim=16, block_size=16, num_layers=2)  # 2 KiB/token fp32
    p = plan(ckpt=torch.float32, elements=1_000_000, kv=tiny, max_model_len=512, max_num_seqs=8)
    assert p.kv_cache_memory_bytes == 8 * tiny.bytes_for(512, torch.float32)


def test_cpu_kv_default_holds_at_least_one_full_sequence():
    # 16 GiB: (16 - 12.85 - 1) / 2 = 1.07 GiB < 2 GiB for one 4096-token sequence, which still fits.
    p = plan(machine=host(AMX, 16))
    assert p.kv_cache_memory_bytes == LLAVA_7B_KV.bytes_for(4096, torch.bfloat16) == 2 * GIB


def test_tensor_parallel_ranks_share_the_host():
    one, two = plan(machine=host(AMX, 20)), plan(machine=host(AMX, 20), tensor_parallel_size=2,
                                                  kv=AttentionGeometry(32, 16, 128, 16, num_layers=32))
    spare = 20 * GIB - B7 * 2 - 2 * RUNTIME_RESERVE_BYTES
    assert two.kv_cache_memory_bytes == spare // 2 // 2 and two.kv_cache_memory_bytes < one.kv_cache_memory_bytes


def test_cuda_kv_default_is_the_card_fraction_left_after_weights():
    card = Host(AVX2, 130 * GIB, 140 * GIB)  # 10 GiB already used by others
    p = plan(device="cuda", machine=card, max_num_seqs=1024)
    assert p.kv_cache_memory_bytes == int(0.9 * 140 * GIB) - 10 * GIB - B7 * 2 - RUNTIME_RESERVE_BYTES


def test_explicit_kv_and_blocks_win():
    assert plan(kv_cache_memory_bytes=123 * 2 ** 20).kv_cache_memory_bytes == 123 * 2 ** 20
    p = plan(num_kv_blocks=10)
    assert p.kv_cache_memory_bytes == 10 * LLAVA_7B_KV.block_bytes(torch.bfloat16)


def test_fp32_on_a_small_machine_is_refused_naming_the_dtype_that_fits():
    with pytest.raises(ConfigError) as e:
        plan(dtype="float32", machine=host(AVX2, 22))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("model M does not fit: it needs 30.7 GiB (25.7 GiB of weights in float32 + 4.0 GiB of "
                          "KV cache (one 4096-token sequence) + 1.0 GiB runtime reserve) but this machine has "
                          "22.0 GiB available")
    assert msg.endswith("engine.dtype=bfloat16 would need 15.9 GiB, which fits")


def test_a_model_no_dtype_fits_is_refused_with_what_to_change():
    with pytest.raises(ConfigError, match=r"needs 15\.9 GiB .* has 8\.0 GiB available; no dtype or quantization "
                                          r"this engine runs fits: use more memory or a smaller engine\.max_model_len"):
        plan(machine=host(AMX, 8))
    with pytest.raises(ConfigError, match=r"KV cache \(engine\.kv_cache_memory_bytes\).*a smaller "
                                          r"engine\.kv_cache_memory_bytes"):
        plan(machine=host(AMX, 20), kv_cache_memory_bytes=10 * GIB)


B7_PROJECTIONS = 6_480_000_000  # of B7, the decoder's projections


def int8_plan(gib, **cfg):
    facts = CheckpointFacts(torch.bfloat16, B7, 0, B7_PROJECTIONS)
    return plan_memory(EngineConfig(device="cpu", **cfg), facts, host(AMX, gib), "model M", LLAVA_7B_KV, 4096)


def test_int8_weights_leave_the_kv_cache_more_room_and_are_suggested_where_they_fit():
    assert int8_plan(14, quantization="int8").kv_cache_memory_bytes > int8_plan(19).kv_cache_memory_bytes >= 0
    with pytest.raises(ConfigError, match=r"engine\.quantization=int8 would need 13\.\d GiB, which fits"):
        int8_plan(14)


def test_int8_still_needs_the_checkpoint_in_its_dtype_while_it_loads():
    with pytest.raises(ConfigError, match="does not fit"):
        int8_plan(13, quantization="int8")  # 12.9 GiB of bf16 + 1 GiB reserve while loading
    assert int8_plan(14.5, quantization="int8").dtype == torch.bfloat16


def test_memory_budget_bytes_caps_the_machine():
    with pytest.raises(ConfigError, match="has 4.0 GiB available"):
        plan(machine=host(AMX, 22), memory_budget_bytes=4 * GIB)


def test_unknown_memory_refuses_nothing():
    p = plan(machine=Host(AVX2, 0, 0))
    assert p.kv_cache_memory_bytes == CPU_KV_CAP_BYTES and p.dtype == torch.bfloat16


def test_pool_engine_plan_has_no_kv():
    p = plan(ckpt=torch.bfloat16, elements=300_000_000, kv=None, machine=host(AVX2, 22))
    assert p.dtype == torch.float32 and p.kv_cache_memory_bytes == 0
    with pytest.raises(ConfigError, match=r"\(1\.1 GiB of weights in float32 \+ 1\.0 GiB runtime reserve\)"):
        plan(dtype="float32", elements=300_000_000, kv=None, machine=host(AVX2, 1))


def test_checkpoint_facts_from_headers(tmp_path):
    facts = hf_checkpoint_facts(str(LLAVA_TINY))
    from safetensors.torch import load_file

    ref = load_file(str(LLAVA_TINY / "model.safetensors"))
    assert facts.dtype == torch.float32 and facts.float_elements == sum(t.numel() for t in ref.values())
    torch.save({"state_dict": {"model.w": torch.zeros(10, 10, dtype=torch.bfloat16),
                               "model.n": torch.zeros(3, dtype=torch.int64)}}, tmp_path / "c.pt")
    pt = file_checkpoint_facts(str(tmp_path / "c.pt"))
    assert (pt.dtype, pt.float_elements, pt.other_bytes) == (torch.bfloat16, 100, 24)
    # The language model's projections, not the vision tower's (CLIP's have the same names).
    projections = [n for n in ref if n.split(".")[-2:-1] and n.split(".")[-2] in (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj") and n.endswith(".weight")]
    assert any("vision_tower" in n for n in projections)
    assert facts.projection_elements == sum(ref[n].numel() for n in projections if "vision_tower" not in n) > 0


PROC_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n\nprocessor\t: 1\n"


def test_host_facts_from_proc_text():
    assert parse_cpu_flags(PROC_CPUINFO) == {"fpu", "avx2", "amx_bf16", "amx_tile"}
    assert parse_cpu_flags("") == frozenset()
    mem = parse_meminfo("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\nHugePages_Total:       0\n")
    assert mem == {"MemTotal": 24000000 * 1024, "MemAvailable": 20000000 * 1024, "HugePages_Total": 0}
    assert Host(parse_cpu_flags(PROC_CPUINFO), 1, 1).native_bf16 and not Host(AVX2, 1, 1).native_bf16
    assert cgroup_room("max\n", "100\n", "") is None
    assert cgroup_room("1000\n", "700\n", "anon 500\ninactive_file 200\n") == 500


def test_a_host_without_flags_keeps_its_memory_and_loses_only_those():
    amx = Host(frozenset({"avx2", "fma", "avx512_bf16", "amx_bf16"}), 8 << 30, 16 << 30)
    plain = amx.without(["avx512_bf16", "amx_bf16", "not_a_flag"])
    assert plain == Host(frozenset({"avx2", "fma"}), 8 << 30, 16 << 30)
    assert amx.native_bf16 and not plain.native_bf16
