"""What the machine offers an engine: CPU features and the memory it may use. `Host.read` reads them
afresh at each call (nothing is cached) into a frozen `Host`; an engine reads one when it starts, for the
sizing rules (engine/memory_plan.py), which take it as an argument, so tests and benchmarks pass their
own (a small memory budget, a CPU without bf16 units) and nothing is patched.

CPU memory is `MemAvailable` from /proc/meminfo (what the kernel can give without swapping: free
memory plus the reclaimable page cache), total is `MemTotal`; inside a cgroup v2 memory limit (a
container's) no more than the limit leaves. On CUDA it is the card's free and total
memory (`torch.cuda.mem_get_info`).
"""
from dataclasses import dataclass
from typing import FrozenSet, Optional

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU units that multiply bf16 natively (Intel, AMD)


def parse_cpu_flags(cpuinfo: str) -> FrozenSet[str]:
    """The `flags` of the first processor in /proc/cpuinfo text (x86; other architectures name them
    `Features`); empty when there are none."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def parse_meminfo(meminfo: str) -> dict:
    """/proc/meminfo text -> {field: bytes} (its values are in kB)."""
    out = {}
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def cgroup_room(limit: str, current: str, stat: str) -> Optional[int]:
    """Bytes a cgroup v2 memory limit still allows (a container's: MemAvailable shows the node's), from
    memory.max, memory.current and memory.stat: the limit less the working set (usage less the
    inactive page cache, as the kubelet counts it). None without a limit."""
    limit, current = limit.strip(), current.strip()
    if not limit.isdigit() or not current.isdigit():
        return None
    fields = dict(line.split(None, 1) for line in stat.splitlines() if len(line.split()) == 2)
    inactive = int(fields.get("inactive_file", "0"))
    return max(0, int(limit) - (int(current) - inactive))


@dataclass(frozen=True)
class Host:
    cpu_flags: FrozenSet[str]
    memory_available: int  # bytes an engine may still take on its device (CPU: MemAvailable)
    memory_total: int  # 0: unknown (then nothing is refused for memory)

    @property
    def memory_known(self) -> bool:
        return self.memory_total > 0

    def within(self, budget: int) -> "Host":
        """This host with at most `budget` bytes available (engine.memory_budget_bytes)."""
        available = min(self.memory_available, budget) if self.memory_known else budget
        return Host(self.cpu_flags, available, max(self.memory_total, budget))

    def without(self, flags) -> "Host":
        """This host with `flags` treated as absent (engine.cpu_features_off)."""
        return Host(self.cpu_flags - frozenset(flags), self.memory_available, self.memory_total)

    @property
    def native_bf16(self) -> bool:
        """The CPU has bf16 matrix units (AMX or AVX512-BF16); without them torch emulates bf16, slowly."""
        return any(flag in self.cpu_flags for flag in NATIVE_BF16_FLAGS)

    @classmethod
    def read(cls, device: Optional[str] = "cpu") -> "Host":
        """This machine, for an engine on `device` (cpu, cuda, cuda:N): read-only, nothing cached."""
        flags = parse_cpu_flags(_read("/proc/cpuinfo"))
        kind = str(device or "cpu")
        if kind.startswith("cuda"):
            import torch

            try:
                free, total = torch.cuda.mem_get_info(torch.device(kind))
            except (RuntimeError, AssertionError, ValueError):  # no such card: the executor names it
                free, total = 0, 0
            return cls(flags, free, total)
        mem = parse_meminfo(_read("/proc/meminfo"))
        total = mem.get("MemTotal", 0)
        host = cls(flags, mem.get("MemAvailable", mem.get("MemFree", total)), total)
        room = cgroup_room(_read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current"),
                           _read("/sys/fs/cgroup/memory.stat"))
        return host if room is None else host.within(room)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # not Linux: no flags, memory unknown (0): the sizing rules then refuse nothing
        return ""
