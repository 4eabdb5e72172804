"""int8 quantization of linear layers' weights (`engine.quantization: int8`).

Each weight row (output channel) is scaled symmetrically into int8 at load: w ≈ q · scale, with
q in [-127, 127] and scale = max|w_row| / 127. Decoding reads the weights once per token, so halving
their bytes (against bf16) is what makes a memory-bound decode faster; the multiply is torch's
`_weight_int8pack_mm` (int8 weights, bf16 activations on the CPU, per-row scales). Past a number of
rows a step is compute-bound and a dense GEMM on weights converted tile by tile beats that kernel. Where
the engine runs our CPU kernels on a CPU without AMX, the weights pack in panels and every step runs on
our packed int8 GEMM (cpu_kernels.PackedWeight): activations quantised to int8 per row and per 512 k
(each block to its largest |x|), 4 bytes of each multiplied into int32 sums a lane (VPDPBUSD with
AVX512-VNNI, else VPMADDUBSW on AVX2: the same sums), the sums scaled back. On AMX hosts small steps run
on our AVX2 int8 GEMM on torch's layout instead (cpu_kernels.linear_int8, fp32 activations), which reads
each weight row once for all rows. Which, and up to how many rows, is the engine's kernel plan's
`Int8Plan` (kernel_plan.int8_plan); this module follows it.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from appliance.engine import cpu_kernels, hugepages

TILE_ROWS = 1024  # weight rows converted at a time (a few MB: stays in cache)
QUANT_CHUNK_ROWS = 256  # weight rows quantised at a time: their fp32 copy (~11 MB at 11008 wide) stays in cache
# torch's int8 kernel on AVX-512 CPUs (torch 2.13) reads past a row whose length is not a multiple of 16:
# wrong sums for one row, a crash for more. Such weights take the tiles instead.
TORCH_KERNEL_K_MULTIPLE = 16


@dataclass(frozen=True)
class Int8Plan:
    """How an int8 weight multiplies on one host (the engine's kernel plan chooses it): torch's int8
    kernel up to `kernel_rows` rows (tokens a step), dense GEMMs on tiles converted to `tile_dtype` past
    them (CPU; on CUDA tiles take the activations' dtype)."""

    kernel_rows: int
    tile_dtype: torch.dtype
    cpu_kernel_rows: int = 0  # steps of up to this many rows run on our int8 GEMM (0: never)
    packed: bool = False  # the weights pack for our packed int8 GEMM, which takes every step
    vnni: bool = False  # packed weights multiply on VPDPBUSD (AVX512-VNNI); else on VPMADDUBSW (AVX2)


class Int8Weight:
    """A [N, K] weight as int8 rows and their N scales (`q`), or packed for our GEMM (`packed`) where the
    plan says so."""

    def __init__(self, weight: torch.Tensor, plan: Int8Plan):
        self.plan = plan
        rows = weight.shape[0]
        # A decode step streams every weight's bytes once: on huge pages (CPU), fewer TLB misses.
        streamed = weight.device.type == "cpu" and not plan.packed
        self.q: Optional[torch.Tensor] = hugepages.empty(weight.shape, torch.int8) if streamed else \
            torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        self.scale = torch.empty(rows, dtype=torch.float32, device=weight.device)
        for start in range(0, rows, QUANT_CHUNK_ROWS):
            chunk = weight[start:start + QUANT_CHUNK_ROWS].float()
            scale = chunk.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
            self.q[start:start + QUANT_CHUNK_ROWS] = torch.round(chunk / scale[:, None]).clamp_(-127, 127)
            self.scale[start:start + QUANT_CHUNK_ROWS] = scale
        self.packed: Optional[cpu_kernels.PackedWeight] = None
        if plan.packed:
            panels = hugepages.empty([cpu_kernels.PackedWeight.numel(rows, weight.shape[1], torch.int8)], torch.int8)
            self.packed = cpu_kernels.PackedWeight(self.q, out=panels, scale=self.scale, vnni=plan.vnni)
            self.q = None  # the rows live on in the panels

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.nbytes
        return self._rows().numel() + self.scale.numel() * self.scale.element_size()

    def _rows(self) -> torch.Tensor:
        """The [N, K] int8 rows; a weight packed for our GEMM keeps them only in its panels."""
        if self.q is None:
            raise RuntimeError("this int8 weight is packed for our GEMM and keeps no separate rows")
        return self.q

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W as the int8 rows stand for it (an unpacked weight)."""
        return (self._rows().to(torch.float32) * self.scale[:, None]).to(dtype)

    def linear(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x Wᵀ (+ bias) for x [..., K], in x's dtype."""
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, shape[-1])
        on_cpu = x.device.type == "cpu"
        if self.packed is not None:
            y = cpu_kernels.linear(x2.float(), self.packed)
        else:
            q = self._rows()
            if on_cpu and x2.shape[0] <= self.plan.cpu_kernel_rows:
                x32 = x2.float()  # [rows, K]: a few KB, converted here so the kernel reads fp32 alone
                y = cpu_kernels.linear_int8(x32 if x32.stride(-1) == 1 else x32.contiguous(), q, self.scale)
            elif x2.shape[0] <= self.plan.kernel_rows and q.shape[1] % TORCH_KERNEL_K_MULTIPLE == 0:
                compute = torch.bfloat16 if on_cpu else dtype
                y = torch.ops.aten._weight_int8pack_mm(x2.to(compute), q, self.scale.to(compute))
            else:
                compute = self.plan.tile_dtype if on_cpu else dtype
                x2 = x2.to(compute)
                y = torch.empty(x2.shape[0], q.shape[0], dtype=compute, device=x.device)
                for start in range(0, q.shape[0], TILE_ROWS):
                    torch.mm(x2, q[start:start + TILE_ROWS].to(compute).t(), out=y[:, start:start + TILE_ROWS])
                y *= self.scale.to(compute)  # the scales on the output: a pass over [rows, N], not over each tile
        y = y.to(dtype).reshape(*shape[:-1], self.scale.shape[0])
        return y if bias is None else y + bias


def kernel_problem(device: torch.device, kernel=None) -> Optional[str]:
    """Why int8 weights cannot run on `device` (None: they can): probes the kernel once with a tiny call."""
    kernel = kernel or torch.ops.aten._weight_int8pack_mm
    compute = torch.bfloat16 if device.type == "cpu" else torch.float16
    try:
        x = torch.ones(1, 64, dtype=compute, device=device)
        q = torch.ones(8, 64, dtype=torch.int8, device=device)
        kernel(x, q, torch.ones(8, dtype=compute, device=device))
    except (RuntimeError, NotImplementedError) as e:
        return f"torch has no int8 weight kernel on {device.type} ({str(e).splitlines()[0][:120]})"
    return None
