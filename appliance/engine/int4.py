"""int4 quantization of linear layers' weights (`engine.quantization: int4`, CPU).

Each weight row is cut into groups of `engine.quantization_group_size` inputs, and each group is mapped
asymmetrically onto 16 levels at load: w ≈ (q - 8) · scale + zero, with q in [0, 15],
scale = (max - min) / 15 and zero = min + 8 · scale (torch's int4 kernel's format; scale and zero are
stored in the kernel's dtype and q is rounded against the stored values). Half a byte a weight, plus 2
scales a group: a decode step reads a quarter of a bf16 model's bytes. Where the plan runs our kernels,
every step multiplies int8 products against x quantised to int8 per row and group (x's rounding moves
results slightly, as int8's GEMM does), on VPDPBUSD on CPUs with AVX512-VNNI (the plan's `vnni`), else on
VPMADDUBSW (AVX2): a few rows (`gemv_rows`, decode) on our GEMV (`cpu_kernels.gemv_int4`,
`cpu_kernels.gemv_int4_avx2`), which reads torch's packed bytes where they lie, bound by the memory; more
(the plan's `gemm`) on our int4 GEMM (`cpu_kernels.linear_int4`, `cpu_kernels.linear_int4_avx2`), which
unpacks the nibbles a few blocks at a time into panels of unsigned quads, compute-bound: the same bits
for a row either way. Each kernel reads the packing torch writes for its ISA (AVX-512: 64-row blocks;
AVX2: 32-row blocks). Elsewhere a few rows multiply on torch's int4 kernel (`_weight_int4pack_mm_for_cpu`),
and past them tiles of the weight dequantised to the plan's dtype feed a dense GEMM: dequantised by our
CPU kernel where the plan says (`cpu_kernels.int4_tiles_`), else by torch ops, the same bits either way.
Both read torch's packed bytes directly: the layout (rows in blocks, each block's rows permuted within a
k) is learned from torch once per engine (`learn_layout`) and checked by a round trip before any weight
is quantised.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from appliance.engine import cpu_kernels, hugepages

TILE_ROWS = 1024  # weight rows dequantised at a time: a multiple of every packed block (64)
QUANT_CHUNK_ROWS = 256  # weight rows quantised at a time (a multiple of 64: chunks pack as the whole would)
INNER_K_TILES = 2  # torch's packing argument; the CPU layout does not depend on it
LEVELS = 15  # q in [0, 15]
MIDPOINT = 8  # the kernel subtracts 8 from q before scaling
N_MULTIPLE = 16  # torch's int4 packing needs output rows in multiples of 16


@dataclass(frozen=True)
class Int4Layout:
    """Where torch's int4 packing puts each row's nibbles: blocks of `block_rows` rows, each block k-major,
    a k's nibbles (low, then high, of each byte) holding the block's rows in `orders[rows in the block]`
    (a weight's last block may be shorter than the rest)."""

    block_rows: int
    orders: Tuple[Tuple[int, Tuple[int, ...]], ...]  # (rows in a block, the row of each nibble slot)

    @property
    def avx2_fast(self) -> bool:
        """Whether our AVX2 int4 kernels read this layout (torch's AVX2 packing: 32-row blocks, a byte
        holding rows j and j + 16)."""
        return self.block_rows == 32 and self.halves(32)

    @property
    def panels_fast(self) -> bool:
        """Whether our VPDPBUSD int4 GEMM unpacks this layout a vector at a time (torch's AVX-512 packing: 64-row
        blocks, a byte holding rows j and j + 32); others it reads nibble by nibble, too slowly to plan."""
        return self.block_rows == 64 and self.halves(64)

    def halves(self, rows: int) -> bool:
        """Whether a byte of a `rows`-row block holds rows i and i + rows/2 (else rows 2i and 2i + 1: the
        two orders torch writes); ValueError for any other."""
        order, half = dict(self.orders)[rows], rows // 2
        if list(order) == list(range(rows)):
            return False
        if list(order[0::2]) == list(range(half)) and list(order[1::2]) == list(range(half, rows)):
            return True
        raise ValueError(f"torch's int4 packing of {rows}-row blocks puts rows in an order the tiles do not read")

    def nibbles(self, rows: int, dst: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The views of `dst` [..., rows] (a k's rows of a block, in row order) that a block's low and high
        nibbles fill."""
        half = rows // 2
        if self.halves(rows):
            return dst[..., :half], dst[..., half:]
        pairs = dst.unflatten(-1, (half, 2))
        return pairs[..., 0], pairs[..., 1]


@dataclass(frozen=True)
class Int4Plan:
    """How int4 weights multiply on one host (the engine's kernel plan chooses it): our int4 GEMV up to
    `gemv_rows` rows a step, else torch's int4 kernel up to `kernel_rows`, past them our int4 GEMM (`gemm`)
    or dense GEMMs on tiles dequantised to `dtype`; our GEMV and GEMM on VPDPBUSD where `vnni`, else on AVX2."""

    group_size: int
    kernel_rows: int
    dtype: torch.dtype  # the kernel's activations, scales and zeros; the tiles
    layout: Int4Layout
    group_sizes: Tuple[int, ...] = ()  # what engine.quantization_group_size allows (named where one does not fit)
    ours: bool = False  # the tiles dequantised by our CPU kernel (cpu_kernels.int4_tiles_), else by torch ops
    vnni: bool = False  # our int4 GEMV and GEMM on VPDPBUSD (AVX512-VNNI), else on AVX2 (VPMADDUBSW)
    gemv_rows: int = 0  # steps of up to these many rows run our int4 GEMV (gemv_int4 or gemv_int4_avx2)
    gemm: bool = False  # past gemv_rows and kernel_rows, our int4 GEMM (linear_int4 or linear_int4_avx2), not tiles


def quantize_groups(weight: torch.Tensor, group_size: int, dtype: torch.dtype):
    """(q int32 [N, K] in 0..15, scale [N, K/g], zero [N, K/g]) of an fp32 weight, scale and zero rounded
    to `dtype` first (as stored) and q rounded against them."""
    n, k = weight.shape
    groups = weight.reshape(n, k // group_size, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / LEVELS).clamp_min(torch.finfo(dtype).tiny).to(dtype).float()
    zero = (low + MIDPOINT * scale).to(dtype).float()
    q = torch.round((groups - zero[..., None]) / scale[..., None] + MIDPOINT).clamp_(0, LEVELS)
    return q.to(torch.int32).reshape(n, k), scale, zero


def pack(q: torch.Tensor) -> torch.Tensor:
    """q int32 [N, K] in torch's int4 CPU layout: uint8 [N, K/2]."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INNER_K_TILES)


def dequantize_transposed(packed: torch.Tensor, scales_and_zeros: torch.Tensor, start: int, stop: int,
                          plan: Int4Plan, dtype: torch.dtype, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rows [start, stop) of a packed weight dequantised to `dtype`, transposed: [K, stop - start], a
    GEMM's right side (`start` on a block boundary): w = q · scale + (zero - 8 · scale). `out`: a buffer
    of at least that size to write into (a layer's tiles reuse one: no fresh pages to fault in per tile)."""
    k, g, rows_out = packed.shape[1] * 2, plan.group_size, stop - start
    out = torch.empty(k, rows_out, dtype=dtype) if out is None else out.view(-1)[:k * rows_out].view(k, rows_out)
    part = scales_and_zeros[:, start:stop].float()  # [K/g, rows, 2]: a few KB
    scale, offset = part[..., 0].to(dtype), (part[..., 1] - MIDPOINT * part[..., 0]).to(dtype)
    block = plan.layout.block_rows
    full = rows_out // block * block
    parts = [(a, b, rows) for a, b, rows in ((0, full, block), (full, rows_out, rows_out - full)) if b > a]
    if plan.ours:  # the same values, rounded as the torch ops below round them
        for a, b, rows in parts:
            cpu_kernels.int4_tiles_(packed[start + a:start + b], scale[:, a:b].float().contiguous(),
                                    offset[:, a:b].float().contiguous(), rows, plan.layout.halves(rows), g,
                                    out[:, a:b])
        return out
    for a, b, rows in parts:
        blocks = (b - a) // rows
        # Bytes to floats first (0..255 are exact in bf16): the nibbles split exactly in float arithmetic,
        # which torch vectorises; its integer bit operations and strided reads are many times slower.
        byte = packed[start + a:start + b].reshape(blocks, k, rows // 2).transpose(0, 1).contiguous().to(dtype)
        high = byte.mul(1 / 16).floor_()
        low = byte.sub_(high, alpha=16)
        dst = out[:, a:b].unflatten(1, (blocks, rows))  # [K, blocks, rows]
        for nibble, into in zip((low, high), plan.layout.nibbles(rows, dst)):
            into.copy_(nibble)
        groups = dst.unflatten(0, (k // g, g))
        groups.mul_(scale[:, a:b].unflatten(1, (blocks, rows))[:, None])
        groups.add_(offset[:, a:b].unflatten(1, (blocks, rows))[:, None])
    return out


def learn_layout() -> Int4Layout:
    """torch's int4 CPU layout on this host (its AVX-512, AVX2 and plain builds differ): rows packed with
    their own index, read back nibble by nibble. A block's rows all appear before the first repeats."""
    rows = _slot_rows(64)
    block = next(i for i in range(1, len(rows) + 1) if i == len(rows) or rows[i] in rows[:i])
    orders: Dict[int, Tuple[int, ...]] = {block: tuple(rows[:block])}
    for partial in range(N_MULTIPLE, block, N_MULTIPLE):  # a weight's last block may be short
        orders[partial] = tuple(_slot_rows(partial)[:partial])
    return Int4Layout(block, tuple(sorted(orders.items())))


def _slot_rows(n: int) -> List[int]:
    """The row of each nibble slot of an [n, 2] weight packed with each row's index (4 bits at a time)."""
    index = torch.arange(n, dtype=torch.int32)[:, None].expand(n, 2)
    digits = []
    for shift in (0, 4):
        packed = pack(((index >> shift) & 0xF).contiguous()).flatten()
        digits.append(torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten().long() << shift)
    return (digits[0] | digits[1]).tolist()


class Int4Weight:
    """A [N, K] weight as torch's packed int4 bytes (`packed`, [N, K/2]) and each group's scale and zero
    (`scales_and_zeros`, [K/g, N, 2] in the plan's dtype, as torch's kernel reads them)."""

    def __init__(self, weight: torch.Tensor, plan: Int4Plan):
        n, k = weight.shape
        self._allocate(n, k, plan)
        for start in range(0, self.out_features, QUANT_CHUNK_ROWS):
            stop = min(start + QUANT_CHUNK_ROWS, self.out_features)
            self._put(start, *quantize_groups(weight[start:stop].float(), plan.group_size, plan.dtype))

    @classmethod
    def from_groups(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, plan: Int4Plan) -> "Int4Weight":
        """A weight quantised already (a checkpoint's groups): q [N, K] in 0..15 (any dtype), scale and zero
        [N, K/g] with w = (q - 8) · scale + zero, stored in the plan's dtype as they are."""
        weight = cls.__new__(cls)
        n, k = q.shape
        weight._allocate(n, k, plan)
        for start in range(0, q.shape[0], QUANT_CHUNK_ROWS):
            stop = min(start + QUANT_CHUNK_ROWS, q.shape[0])
            weight._put(start, q[start:stop].to(torch.int32), scale[start:stop], zero[start:stop])
        return weight

    def _allocate(self, n: int, k: int, plan: Int4Plan) -> None:
        self.plan = plan
        # How torch's packing orders the rows of a full block and of the short last one (if any): read once,
        # not per step.
        tail = n % plan.layout.block_rows
        self.block_halves = plan.layout.halves(plan.layout.block_rows)
        self.tail_halves = tail > 0 and plan.layout.halves(tail)
        # A decode step streams every weight's bytes once: on huge pages, fewer TLB misses.
        self.packed = hugepages.empty([n, k // 2], torch.uint8)
        self.scales_and_zeros = torch.empty(k // plan.group_size, n, 2, dtype=plan.dtype)

    def _put(self, start: int, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """Rows from `start`: q int32 [rows, K], scale and zero [rows, K/g]."""
        stop = start + q.shape[0]
        self.packed[start:stop] = pack(q.contiguous())
        self.scales_and_zeros[:, start:stop] = torch.stack((scale, zero), dim=-1).transpose(0, 1)

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()

    def tile_transposed(self, start: int, stop: int, dtype: torch.dtype,
                        out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rows [start, stop) of W dequantised to `dtype`, transposed: [K, rows] (in `out` if given)."""
        return dequantize_transposed(self.packed, self.scales_and_zeros, start, stop, self.plan, dtype, out)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W as the int4 groups stand for it."""
        return self.tile_transposed(0, self.out_features, dtype).t().contiguous()

    def linear(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x Wᵀ (+ bias) for x [..., K], in x's dtype."""
        shape, dtype, compute = x.shape, x.dtype, self.plan.dtype
        x2 = x.reshape(-1, shape[-1]).to(compute).contiguous()
        n, rows = self.out_features, x2.shape[0]
        if rows <= self.plan.gemv_rows:
            gemv = cpu_kernels.gemv_int4 if self.plan.vnni else cpu_kernels.gemv_int4_avx2
            y = gemv(x2.float(), self.packed, self.scales_and_zeros, self.tail_halves, self.plan.group_size)
        elif rows <= self.plan.kernel_rows:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.plan.group_size,
                                                           self.scales_and_zeros)
        elif self.plan.gemm and self.plan.vnni:
            y = cpu_kernels.linear_int4(x2.float(), self.packed, self.scales_and_zeros, self.plan.layout.block_rows,
                                        self.block_halves, self.tail_halves, self.plan.group_size)
        elif self.plan.gemm:
            y = cpu_kernels.linear_int4_avx2(x2.float(), self.packed, self.scales_and_zeros, self.tail_halves,
                                             self.plan.group_size)
        else:
            y = torch.empty(x2.shape[0], n, dtype=compute)
            buffer = torch.empty(x2.shape[1] * min(TILE_ROWS, n), dtype=compute)
            for start in range(0, n, TILE_ROWS):
                stop = min(start + TILE_ROWS, n)
                torch.mm(x2, self.tile_transposed(start, stop, compute, buffer), out=y[:, start:stop])
        y = y.to(dtype).reshape(*shape[:-1], n)
        return y if bias is None else y + bias


def layer_problem(name: str, out_features: int, in_features: int, group_size: int,
                  group_sizes: Tuple[int, ...]) -> Optional[str]:
    """Why layer `name` cannot hold int4 weights in groups of `group_size` (None: it can)."""
    if out_features % N_MULTIPLE:
        return (f"{name} has {out_features} output features (per rank), not a multiple of {N_MULTIPLE} as "
                f"torch's int4 kernel needs; use engine.quantization=int8")
    if in_features % group_size:
        fit = [str(g) for g in group_sizes if in_features % g == 0]
        hint = f"group sizes that fit: {', '.join(fit)}" if fit else "no group size fits; use engine.quantization=int8"
        return (f"{name} has {in_features} input features (per rank), not a multiple of "
                f"engine.quantization_group_size={group_size}; {hint}")
    return None


def kernel_problem(layout: Int4Layout, dtype: torch.dtype) -> Optional[str]:
    """Why int4 weights cannot run here (None: they can): torch's kernel on a small weight, and the
    learned layout read back exactly, after a full block and each shorter one (scale 1, zero 8: w = q)."""
    generator = torch.Generator().manual_seed(0)
    for rows, _ in layout.orders:
        n = layout.block_rows + rows
        q = torch.randint(0, LEVELS + 1, (n, 64), dtype=torch.int32, generator=generator)
        scales_and_zeros = torch.tensor([1.0, float(MIDPOINT)], dtype=dtype).expand(2, n, 2).contiguous()
        try:
            packed = pack(q)
            torch.ops.aten._weight_int4pack_mm_for_cpu(torch.ones(1, 64, dtype=dtype), packed, 32, scales_and_zeros)
        except (RuntimeError, NotImplementedError) as e:
            return f"torch has no int4 weight kernel on this CPU ({str(e).splitlines()[0][:120]})"
        try:
            read = dequantize_transposed(packed, scales_and_zeros, 0, n, Int4Plan(32, 0, dtype, layout), dtype)
        except ValueError as e:
            return str(e)
        if not torch.equal(read.t().float(), q.float()):
            return "torch's int4 packing on this CPU is not the layout the dequantised tiles read"
    return None
