// Our CPU kernels (cpu_kernels.h) as torch operators, `torch.ops.appliance.*`, each checking its
// arguments before the C code runs: devices, dtypes, ranks, shapes and strides, and every block, slot and
// position id the kernel will index with. A failed check raises a Python exception (TORCH_CHECK_VALUE:
// ValueError, TORCH_CHECK_INDEX: IndexError) and the kernel never runs; nothing here is an assert, so
// `python -O` changes nothing. Registered for the CPU dispatch key only: inputs on another device fail in
// the dispatcher. Built by appliance/engine/build_kernels.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "cpu_kernels.h"
#include "panel_layout.h"

namespace {

void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
}

// A small op's fp32 or bf16 tensor; `like`, if given, the tensor whose dtype it must share.
void check_small(const at::Tensor& t, const char* name, int64_t dim, const at::Tensor* like = nullptr) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
                    " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_VALUE(like == nullptr || t.scalar_type() == like->scalar_type(), name, " must be ",
                    like ? like->scalar_type() : t.scalar_type(), " as the input is, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
}

uint16_t* bf16_ptr(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// An index tensor as int64 contiguous (converted if needed), `dim`-D.
at::Tensor ids(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
  TORCH_CHECK_VALUE(!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()), name,
                    " must hold integers, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
  return t.to(at::kLong).contiguous();
}

// Every value of `t` (int64 contiguous) in [0, limit).
void check_ids_below(const at::Tensor& t, int64_t limit, const char* name, const char* what) {
  const int64_t* p = t.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); i++)
    TORCH_CHECK_INDEX(p[i] >= 0 && p[i] < limit, name, "[", i, "] = ", p[i], " is outside the ", limit, " ",
                      what);
}

// Rows of a 2-D view: unit stride within a row.
void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.size(1) <= 1 || t.stride(1) == 1, name, " must have contiguous rows, got strides ",
                    t.strides());
}

// [T, H, D] with each token's heads contiguous (rows may be strided: views into a fused qkv output).
void check_heads(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.stride(2) == 1 && t.stride(1) == t.size(2), name,
                    " must have contiguous heads ([T, H, D] with strides [any, D, 1]), got strides ", t.strides());
}

// k per group of a bf16 (pairs) or int8 (quads) weight's panels.
int64_t group_k(at::ScalarType dtype) { return dtype == at::kChar ? 4 : 2; }

void check_packable(at::ScalarType dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kChar,
                    "weight must be float32, bfloat16 or int8, got ", dtype);
}

// The shape pack_weight packs an [n, k] weight of `dtype` into (panel_layout.h): what cpu_kernels.py sizes
// its buffers by.
std::vector<int64_t> packed_weight_shape(int64_t n, int64_t k, at::ScalarType dtype) {
  check_packable(dtype);
  TORCH_CHECK_VALUE(n >= 0 && k >= 0, "a weight's sizes must be >= 0, got [", n, ", ", k, "]");
  std::vector<int64_t> shape(3);
  packed_shape(n, k, at::elementSize(dtype), shape.data());
  return shape;
}

void pack_weight(const at::Tensor& weight, const at::Tensor& out) {
  TORCH_CHECK_VALUE(weight.device().is_cpu() && weight.dim() == 2, "weight must be a 2-D CPU tensor, got ",
                    weight.sizes(), " on ", weight.device());
  check_packable(weight.scalar_type());
  TORCH_CHECK_VALUE(out.device().is_cpu() && out.dim() == 1 && out.scalar_type() == weight.scalar_type(),
                    "out must be a 1-D CPU tensor of the weight's dtype, got ", out.scalar_type(), " ", out.sizes());
  const int64_t n = weight.size(0), k = weight.size(1);
  const std::vector<int64_t> shape = packed_weight_shape(n, k, weight.scalar_type());
  const int64_t numel = shape[0] * shape[1] * shape[2];
  TORCH_CHECK_VALUE(out.is_contiguous() && out.numel() == numel, "out must be a contiguous ", numel,
                    "-element buffer for a [", n, ", ", k, "] weight, got ", out.numel());
  const at::Tensor w = weight.contiguous();
  if (weight.scalar_type() == at::kBFloat16)
    pack_weight_bf16(reinterpret_cast<const uint16_t*>(w.const_data_ptr<at::BFloat16>()), n, k,
                     reinterpret_cast<uint16_t*>(out.mutable_data_ptr<at::BFloat16>()));
  else if (weight.scalar_type() == at::kChar)
    pack_weight_int8(w.const_data_ptr<int8_t>(), n, k, out.mutable_data_ptr<int8_t>());
  else
    pack_weight_f32(w.const_data_ptr<float>(), n, k, out.mutable_data_ptr<float>());
}

// y = x W^T for a bf16 or int8 weight packed by pack_weight; `units`: on the CPU's AVX-512 dot-product units
// (VDPBF16PS, VPDPBUSD) or on AVX2 alone. bf16 weights on VDPBF16PS: bf16 x and y (x's rows padded to an
// even length: the kernel reads k in pairs); widened to fp32 on AVX2/FMA: fp32 or bf16 x, y in x's dtype.
// int8 weights, either kernel: fp32 x and y (times `scale` per output).
at::Tensor linear_packed_groups(const at::Tensor& x_in, const at::Tensor& packed, int64_t out_features,
                               const std::optional<at::Tensor>& scale, bool units) {
  const bool int8 = packed.scalar_type() == at::kChar, fma = !int8 && !units;
  if (fma) {
    TORCH_CHECK_VALUE((x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16) && x_in.dim() == 2,
                      "x must be 2-D float32 or bfloat16 for a bf16 weight on AVX2, got ", x_in.scalar_type(), " ",
                      x_in.sizes());
  } else {
    TORCH_CHECK_VALUE(x_in.scalar_type() == (int8 ? at::kFloat : at::kBFloat16) && x_in.dim() == 2, "x must be 2-D ",
                      int8 ? "float32 for an int8" : "bfloat16 for a bf16", " weight, got ", x_in.scalar_type(), " ",
                      x_in.sizes());
  }
  check_rows(x_in, "x");
  const int64_t g = group_k(packed.scalar_type());
  TORCH_CHECK_VALUE(packed.is_contiguous() && packed.size(2) == g * BPANEL, "packed weight must be a "
                    "contiguous [panels, ceil(K/", g, "), ", g * BPANEL, "], got shape ", packed.sizes());
  const int64_t m = x_in.size(0), k = x_in.size(1), panels = packed.size(0);
  TORCH_CHECK_VALUE((k + g - 1) / g == packed.size(1), "packed linear takes input [..., ", g * packed.size(1) - g + 1,
                    " to ", g * packed.size(1), "], got ", x_in.sizes());
  TORCH_CHECK_VALUE(out_features > (panels - 1) * BPANEL && out_features <= panels * BPANEL,
                    "out_features ", out_features, " does not fit a weight packed in ", panels, " panels of ", BPANEL);
  TORCH_CHECK_VALUE(int8 == scale.has_value(), int8 ? "an int8 weight needs its scales"
                                                    : "scales are for int8 weights only");
  const at::ScalarType y_type = int8 ? at::kFloat : fma ? x_in.scalar_type() : at::kBFloat16;
  at::Tensor y = at::empty({m, out_features}, x_in.options().dtype(at::kFloat));
  if (m == 0) return y.to(y_type);
  if (int8) {
    TORCH_CHECK_VALUE(scale->device().is_cpu() && scale->scalar_type() == at::kFloat && scale->dim() == 1 &&
                      scale->size(0) == out_features && scale->is_contiguous(), "scale must be contiguous float32 [",
                      out_features, "], got ", scale->scalar_type(), " ", scale->sizes());
    const auto kernel = units ? linear_packed_int8 : linear_packed_int8_avx2;
    const int rc = kernel(x_in.const_data_ptr<float>(), m > 1 ? x_in.stride(0) : k, packed.const_data_ptr<int8_t>(),
                          scale->const_data_ptr<float>(), y.mutable_data_ptr<float>(), out_features, m, out_features,
                          k);
    TORCH_CHECK(rc != -1, "the packed int8 GEMM on VPDPBUSD needs a CPU with AVX512-VNNI");
    TORCH_CHECK(rc == 0, "out of memory for the int8 GEMM's quantised x");
    return y;
  }
  if (fma) {  // x widened once (M x K, against the M x N x K products), the weights in registers
    const at::Tensor x = x_in.scalar_type() == at::kFloat ? x_in : x_in.to(at::kFloat);
    linear_packed_bf16_fma(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k,
                           reinterpret_cast<const uint16_t*>(packed.const_data_ptr<at::BFloat16>()),
                           y.mutable_data_ptr<float>(), out_features, m, out_features, k);
    return y.to(y_type);
  }
  at::Tensor x = x_in;
  if (k % 2 == 1)
    x = at::constant_pad_nd(x_in, {0, 1});  // a zero k beside the weight's zero pad
  else if (m > 1 && x_in.stride(0) % 2 == 1)
    x = x_in.contiguous();
  const int rc = linear_packed_bf16(reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>()),
                                    m > 1 ? x.stride(0) : x.size(1),
                                    reinterpret_cast<const uint16_t*>(packed.const_data_ptr<at::BFloat16>()),
                                    y.mutable_data_ptr<float>(), out_features, m, out_features, k);
  TORCH_CHECK(rc == 0, "the packed bf16 GEMM needs a CPU with AVX512-BF16");
  return y.to(at::kBFloat16);
}

// units: whether bf16 and int8 weights multiply on the CPU's AVX-512 dot-product units or on AVX2 alone (the
// engine's kernel plan chooses); fp32 weights ignore it.
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                         const std::optional<at::Tensor>& scale, bool units) {
  TORCH_CHECK_VALUE(packed.device().is_cpu() && packed.dim() == 3, "packed weight must be a 3-D CPU tensor, got ",
                    packed.sizes(), " on ", packed.device());
  if (packed.scalar_type() == at::kBFloat16 || packed.scalar_type() == at::kChar)
    return linear_packed_groups(x, packed, out_features, scale, units);
  TORCH_CHECK_VALUE(!scale.has_value(), "scales are for int8 weights only");
  check_f32(x, "x", 2);
  check_f32(packed, "packed weight", 3);
  check_rows(x, "x");
  TORCH_CHECK_VALUE(packed.is_contiguous() && packed.size(2) == PANEL, "packed weight must be a contiguous "
                    "[panels, K, ", PANEL, "], got shape ", packed.sizes());
  const int64_t m = x.size(0), k = packed.size(1), panels = packed.size(0);
  TORCH_CHECK_VALUE(x.size(1) == k, "packed linear takes input [..., ", k, "], got ", x.sizes());
  TORCH_CHECK_VALUE(out_features > (panels - 1) * PANEL && out_features <= panels * PANEL, "out_features ",
                    out_features, " does not fit a weight packed in ", panels, " panels of ", PANEL);
  at::Tensor y = at::empty({m, out_features}, x.options());
  if (m > 0)
    linear_packed_f32(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k, packed.const_data_ptr<float>(),
                      y.mutable_data_ptr<float>(), out_features, m, out_features, k);
  return y;
}

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  // fp32 or bf16 caches, one dtype for both; q (of either dtype) is computed in fp32, the output returns in
  // q's dtype.
  TORCH_CHECK_VALUE(q_in.device().is_cpu() && q_in.dim() == 3, "q must be a 3-D CPU tensor, got ", q_in.sizes(),
                    " on ", q_in.device());
  TORCH_CHECK_VALUE(q_in.scalar_type() == at::kFloat || q_in.scalar_type() == at::kBFloat16,
                    "q must be float32 or bfloat16, got ", q_in.scalar_type());
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  for (const at::Tensor* cache : {&k_cache, &v_cache}) {
    const char* name = cache == &k_cache ? "k_cache" : "v_cache";
    TORCH_CHECK_VALUE(cache->device().is_cpu() && cache->dim() == 4, name, " must be a 4-D CPU tensor, got ",
                      cache->sizes(), " on ", cache->device());
    TORCH_CHECK_VALUE(cache->scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat), name, " must be float32 or "
                      "bfloat16, the same for both caches, got ", cache->scalar_type());
  }
  TORCH_CHECK_VALUE(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
                    "k_cache and v_cache must be contiguous [num_blocks, block_size, kv_heads, head_dim] of "
                    "one shape, got ", k_cache.sizes(), " and ", v_cache.sizes());
  const at::Tensor q = q_in.to(at::kFloat).contiguous();
  const int64_t b = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t num_blocks = k_cache.size(0), block_size = k_cache.size(1), hk = k_cache.size(2);
  TORCH_CHECK_VALUE(k_cache.size(3) == d && d % 8 == 0, "head_dim must be a multiple of 8 and the same in q ",
                    q.sizes(), " and the caches ", k_cache.sizes());
  TORCH_CHECK_VALUE(hk > 0 && hq % hk == 0, "q's ", hq, " heads must be a multiple of the caches' ", hk,
                    " kv heads");
  const at::Tensor tables = ids(block_tables, "block_tables", 2);
  const at::Tensor lens = ids(context_lens, "context_lens", 1);
  const int64_t width = tables.size(1);
  TORCH_CHECK_VALUE(tables.size(0) == b && lens.size(0) == b, "block_tables ", tables.sizes(),
                    " and context_lens ", lens.sizes(), " must have one row per query (", b, ")");
  const int64_t* table = tables.const_data_ptr<int64_t>();
  const int64_t* len = lens.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < b; i++) {
    TORCH_CHECK_INDEX(len[i] >= 1 && len[i] <= width * block_size, "context_lens[", i, "] = ", len[i],
                      " is outside 1..", width * block_size, " (", width, " blocks of ", block_size, ")");
    for (int64_t j = 0; j < (len[i] + block_size - 1) / block_size; j++) {
      const int64_t id = table[i * width + j];
      TORCH_CHECK_INDEX(id >= 0 && id < num_blocks, "block_tables[", i, ", ", j, "] = ", id,
                        " is outside the cache's ", num_blocks, " blocks");
    }
  }
  at::Tensor out = at::empty_like(q);
  if (b == 0) return out.to(q_in.scalar_type());
  const int rc = bf16
      ? paged_decode_attention_bf16(q.const_data_ptr<float>(),
                                    reinterpret_cast<const uint16_t*>(k_cache.const_data_ptr<at::BFloat16>()),
                                    reinterpret_cast<const uint16_t*>(v_cache.const_data_ptr<at::BFloat16>()),
                                    table, width, len, out.mutable_data_ptr<float>(), b, hq, hk, d, block_size,
                                    static_cast<float>(scale))
      : paged_decode_attention_f32(q.const_data_ptr<float>(), k_cache.const_data_ptr<float>(),
                                   v_cache.const_data_ptr<float>(), table, width, len,
                                   out.mutable_data_ptr<float>(), b, hq, hk, d, block_size,
                                   static_cast<float>(scale));
  TORCH_CHECK(rc == 0, "paged_decode_attention: out of memory for the attention scores");
  return out.to(q_in.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_small(x, "x", 2);
  check_small(weight, "weight", 1, &x);
  check_rows(x, "x");
  const int64_t m = x.size(0), d = x.size(1), ldx = m > 1 ? x.stride(0) : d;
  TORCH_CHECK_VALUE(weight.size(0) == d && weight.is_contiguous(), "weight must be contiguous [", d, "], got ",
                    weight.sizes());
  at::Tensor out = at::empty({m, d}, x.options());
  if (m == 0) return out;
  if (x.scalar_type() == at::kBFloat16)
    rms_norm_bf16(bf16_ptr(x), ldx, bf16_ptr(weight), static_cast<float>(eps), bf16_ptr(out), m, d);
  else
    rms_norm_f32(x.const_data_ptr<float>(), ldx, weight.const_data_ptr<float>(), static_cast<float>(eps),
                 out.mutable_data_ptr<float>(), m, d);
  return out;
}

void rotary_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions, const at::Tensor& cos,
             const at::Tensor& sin) {
  check_small(q, "q", 3);
  check_small(k, "k", 3, &q);
  check_small(cos, "cos", 2, &q);
  check_small(sin, "sin", 2, &q);
  check_heads(q, "q");
  check_heads(k, "k");
  const int64_t t = q.size(0), d = q.size(2);
  TORCH_CHECK_VALUE(k.size(0) == t && k.size(2) == d && d % 2 == 0, "q ", q.sizes(), " and k ", k.sizes(),
                    " must share tokens and an even head_dim");
  TORCH_CHECK_VALUE(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() && cos.size(1) == d,
                    "cos and sin must be contiguous [positions, ", d, "], got ", cos.sizes(), " and ", sin.sizes());
  const at::Tensor pos = ids(positions, "positions", 1);
  TORCH_CHECK_VALUE(pos.size(0) == t, "positions must have one entry per token (", t, "), got ", pos.size(0));
  check_ids_below(pos, cos.size(0), "positions", "rotary table positions");
  if (t == 0) return;
  if (q.scalar_type() == at::kBFloat16)
    rotary_bf16(bf16_ptr(q), q.stride(0), bf16_ptr(k), k.stride(0), pos.const_data_ptr<int64_t>(), bf16_ptr(cos),
                bf16_ptr(sin), t, q.size(1), k.size(1), d);
  else
    rotary_f32(q.mutable_data_ptr<float>(), q.stride(0), k.mutable_data_ptr<float>(), k.stride(0),
               pos.const_data_ptr<int64_t>(), cos.const_data_ptr<float>(), sin.const_data_ptr<float>(), t,
               q.size(1), k.size(1), d);
}

void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots, const at::Tensor& k_cache,
              const at::Tensor& v_cache) {
  check_small(k, "k", 3);
  check_small(v, "v", 3, &k);
  check_heads(k, "k");
  check_heads(v, "v");
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "k ", k.sizes(), " and v ", v.sizes(), " must have one shape");
  TORCH_CHECK_VALUE(k_cache.device().is_cpu() && k_cache.scalar_type() == k.scalar_type() && k_cache.is_contiguous() &&
                    v_cache.device().is_cpu() && v_cache.scalar_type() == k.scalar_type() && v_cache.is_contiguous() &&
                    k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache must be contiguous ", k.scalar_type(),
                    " CPU tensors of one shape, as k is, got ", k_cache.sizes(), " and ", v_cache.sizes());
  const int64_t t = k.size(0), width = k.size(1) * k.size(2);
  TORCH_CHECK_VALUE(width > 0 && k_cache.numel() % width == 0, "the caches (", k_cache.sizes(),
                    ") do not hold rows of kv_heads * head_dim = ", width);
  const at::Tensor s = ids(slots, "slots", 1);
  TORCH_CHECK_VALUE(s.size(0) == t, "slots must have one entry per token (", t, "), got ", s.size(0));
  check_ids_below(s, k_cache.numel() / width, "slots", "cache slots");
  if (t > 0)
    write_kv_rows(k.const_data_ptr(), k.stride(0), v.const_data_ptr(), v.stride(0), s.const_data_ptr<int64_t>(),
                  k_cache.mutable_data_ptr(), v_cache.mutable_data_ptr(), t, width, k.element_size());
}

at::Tensor silu_mul(const at::Tensor& x_in) {
  check_small(x_in, "x", 2);
  TORCH_CHECK_VALUE(x_in.size(1) % 2 == 0, "x must be [M, 2I] (gate and up), got ", x_in.sizes());
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), i = x.size(1) / 2;
  at::Tensor out = at::empty({m, i}, x.options());
  if (m == 0 || i == 0) return out;
  if (x.scalar_type() == at::kBFloat16)
    silu_mul_bf16(bf16_ptr(x), bf16_ptr(out), m, i);
  else
    silu_mul_f32(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), m, i);
  return out;
}

at::Tensor argmax_rows(const at::Tensor& x_in) {
  check_f32(x_in, "x", 2);
  TORCH_CHECK_VALUE(x_in.size(1) > 0, "argmax of empty rows, shape ", x_in.sizes());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  if (x.size(0) > 0) argmax_rows_f32(x.const_data_ptr<float>(), x.size(0), x.size(1), out.mutable_data_ptr<int64_t>());
  return out;
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  check_f32(x, "x", 2);
  check_f32(scale, "scale", 1);
  check_rows(x, "x");
  TORCH_CHECK_VALUE(q.device().is_cpu() && q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(),
                    "q must be a contiguous 2-D int8 CPU tensor, got ", q.scalar_type(), " ", q.sizes(), " on ",
                    q.device());
  const int64_t m = x.size(0), n = q.size(0), k = q.size(1);
  TORCH_CHECK_VALUE(x.size(1) == k, "int8 linear takes x [M, ", k, "] for q ", q.sizes(), ", got x ", x.sizes());
  TORCH_CHECK_VALUE(scale.size(0) == n && scale.is_contiguous(), "scale must be contiguous [", n,
                    "] (one per row of q), got ", scale.sizes());
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0)
    linear_int8_f32(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k, q.const_data_ptr<int8_t>(),
                    scale.const_data_ptr<float>(), y.mutable_data_ptr<float>(), n, m, n, k);
  return y;
}

at::Tensor linear_bf16w(const at::Tensor& x, const at::Tensor& w, bool bf16_units) {
  check_f32(x, "x", 2);
  check_rows(x, "x");
  TORCH_CHECK_VALUE(w.device().is_cpu() && w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(),
                    "w must be a contiguous 2-D bf16 CPU tensor, got ", w.scalar_type(), " ", w.sizes(), " on ",
                    w.device());
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  TORCH_CHECK_VALUE(x.size(1) == k, "bf16 linear takes x [M, ", k, "] for w ", w.sizes(), ", got x ", x.sizes());
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0)
    linear_bf16w_f32(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k,
                     reinterpret_cast<const uint16_t*>(w.const_data_ptr<at::BFloat16>()), y.mutable_data_ptr<float>(),
                     n, m, n, k, bf16_units ? 1 : 0);
  return y;
}

void int4_tiles_(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset, int64_t block_rows,
                 bool halves, int64_t group_size, at::Tensor& out) {
  TORCH_CHECK_VALUE(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                    packed.is_contiguous(), "packed must be a contiguous 2-D uint8 CPU tensor, got ",
                    packed.scalar_type(), " ", packed.sizes());
  check_f32(scale, "scale", 2);
  check_f32(offset, "offset", 2);
  TORCH_CHECK_VALUE(out.device().is_cpu() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16) &&
                    out.dim() == 2 && out.stride(1) == 1, "out must be a 2-D float32 or bf16 CPU tensor with "
                    "contiguous rows, got ", out.scalar_type(), " ", out.sizes());
  const int64_t cols = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK_VALUE(block_rows > 0 && block_rows <= 64 && block_rows % 2 == 0 && cols % block_rows == 0,
                    "block_rows must be even, at most 64 and divide the ", cols, " packed rows, got ", block_rows);
  TORCH_CHECK_VALUE(group_size > 0 && k % group_size == 0, "group_size must divide K = ", k, ", got ", group_size);
  TORCH_CHECK_VALUE(scale.sizes() == offset.sizes() && scale.size(0) == k / group_size && scale.size(1) == cols &&
                    scale.is_contiguous() && offset.is_contiguous(), "scale and offset must be contiguous [",
                    k / group_size, ", ", cols, "], got ", scale.sizes(), " and ", offset.sizes());
  TORCH_CHECK_VALUE(out.size(0) == k && out.size(1) == cols, "out must be [", k, ", ", cols, "], got ", out.sizes());
  if (cols > 0 && k > 0)
    int4_tiles(packed.const_data_ptr<uint8_t>(), cols / block_rows, block_rows, k, halves ? 1 : 0,
               scale.const_data_ptr<float>(), offset.const_data_ptr<float>(), cols, group_size, out.data_ptr(),
               out.stride(0), out.scalar_type() == at::kBFloat16 ? 1 : 0);
}

// The shared checks of the int4 products' arguments (x [M, K] fp32, packed [N, K / 2] uint8, the [K / g, N, 2]
// scale and zero pairs) and y [M, N] for them.
at::Tensor int4_output(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                       int64_t group_size) {
  check_f32(x, "x", 2);
  check_rows(x, "x");
  TORCH_CHECK_VALUE(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                    packed.is_contiguous(), "packed must be a contiguous 2-D uint8 CPU tensor, got ",
                    packed.scalar_type(), " ", packed.sizes());
  const int64_t m = x.size(0), n = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK_VALUE(x.size(1) == k, "int4 linear takes x [M, ", k, "] for packed ", packed.sizes(), ", got x ",
                    x.sizes());
  TORCH_CHECK_VALUE(group_size >= 4 && group_size % 4 == 0 && group_size <= 128 && k % group_size == 0,
                    "group_size must be a multiple of 4 up to 128 that divides K = ", k, ", got ", group_size);
  TORCH_CHECK_VALUE(scales_and_zeros.device().is_cpu() && scales_and_zeros.is_contiguous() &&
                    (scales_and_zeros.scalar_type() == at::kFloat || scales_and_zeros.scalar_type() == at::kBFloat16) &&
                    scales_and_zeros.sizes() == at::IntArrayRef({k / group_size, n, 2}),
                    "scales_and_zeros must be a contiguous float32 or bf16 CPU tensor [", k / group_size, ", ", n,
                    ", 2], got ", scales_and_zeros.scalar_type(), " ", scales_and_zeros.sizes());
  return at::empty({m, n}, x.options());
}

void check_int4_rc(int rc, const char* kernel) {
  TORCH_CHECK(rc != -1, "the int4 ", kernel, " on VPDPBUSD needs a CPU with AVX512-VNNI");
  TORCH_CHECK(rc == 0, "out of memory for the int4 ", kernel, "'s quantised x");
}

at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                       int64_t block_rows, bool halves, bool tail_halves, int64_t group_size) {
  at::Tensor y = int4_output(x, packed, scales_and_zeros, group_size);
  const int64_t m = x.size(0), n = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK_VALUE(block_rows > 0 && block_rows <= 64 && block_rows % 2 == 0 && n % 2 == 0,
                    "block_rows must be even and at most 64, and the packed rows even, got ", block_rows, " and ", n);
  if (m > 0 && n > 0 && k > 0)
    check_int4_rc(linear_int4_vnni(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k,
                                   packed.const_data_ptr<uint8_t>(), block_rows, halves ? 1 : 0, tail_halves ? 1 : 0,
                                   scales_and_zeros.const_data_ptr(), 2 * n,
                                   scales_and_zeros.scalar_type() == at::kBFloat16 ? 1 : 0,
                                   y.mutable_data_ptr<float>(), n, m, n, k, group_size), "GEMM");
  return y;
}

// The kernels that read torch's packing of one ISA where it lies, or unpack it a block at a time: the GEMV
// on AVX-512's (64-row blocks) on VPDPBUSD, and the GEMV and GEMM on AVX2's (32-row blocks) on AVX2 alone.
// Both packings hold rows in 16s.
using int4_kernel = int (*)(const float*, int64_t, const uint8_t*, int, const void*, int64_t, int, float*, int64_t,
                            int64_t, int64_t, int64_t, int64_t);

at::Tensor int4_on_packing(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                           bool tail_halves, int64_t group_size, int4_kernel kernel, const char* name, bool avx2) {
  at::Tensor y = int4_output(x, packed, scales_and_zeros, group_size);
  const int64_t m = x.size(0), n = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK_VALUE(n % 16 == 0, "the int4 ", name, " reads torch's ", avx2 ? "AVX2" : "AVX-512",
                    " packing, whose rows come in 16s, got ", n);
  if (m > 0 && n > 0 && k > 0)
    check_int4_rc(kernel(x.const_data_ptr<float>(), m > 1 ? x.stride(0) : k, packed.const_data_ptr<uint8_t>(),
                         tail_halves ? 1 : 0, scales_and_zeros.const_data_ptr(), 2 * n,
                         scales_and_zeros.scalar_type() == at::kBFloat16 ? 1 : 0, y.mutable_data_ptr<float>(), n,
                         m, n, k, group_size), name);
  return y;
}

at::Tensor gemv_int4(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                     bool tail_halves, int64_t group_size) {
  return int4_on_packing(x, packed, scales_and_zeros, tail_halves, group_size, gemv_int4_vnni, "GEMV", false);
}

at::Tensor gemv_int4_avx2_op(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                             bool tail_halves, int64_t group_size) {
  return int4_on_packing(x, packed, scales_and_zeros, tail_halves, group_size, gemv_int4_avx2, "GEMV", true);
}

at::Tensor linear_int4_avx2_op(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_and_zeros,
                               bool tail_halves, int64_t group_size) {
  return int4_on_packing(x, packed, scales_and_zeros, tail_halves, group_size, linear_int4_avx2, "GEMM", true);
}

}  // namespace

TORCH_LIBRARY(appliance, m) {
  // No tensor to dispatch on: one kernel for every backend.
  m.def("packed_shape(int out_features, int in_features, ScalarType dtype) -> int[]", &packed_weight_shape);
  m.def("pack_weight(Tensor weight, Tensor(a!) out) -> ()");
  m.def("linear_packed(Tensor x, Tensor packed, int out_features, Tensor? scale=None, bool units=True) -> "
        "Tensor");
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor positions, Tensor cos, Tensor sin) -> ()");
  m.def("write_kv(Tensor k, Tensor v, Tensor slots, Tensor(a!) k_cache, Tensor(b!) v_cache) -> ()");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor q, Tensor scale) -> Tensor");
  m.def("linear_bf16w(Tensor x, Tensor w, bool bf16_units=True) -> Tensor");
  m.def("int4_tiles_(Tensor packed, Tensor scale, Tensor offset, int block_rows, bool halves, int group_size, "
        "Tensor(a!) out) -> ()");
  m.def("linear_int4(Tensor x, Tensor packed, Tensor scales_and_zeros, int block_rows, bool halves, "
        "bool tail_halves, int group_size) -> Tensor");
  m.def("gemv_int4(Tensor x, Tensor packed, Tensor scales_and_zeros, bool tail_halves, int group_size) -> Tensor");
  m.def("gemv_int4_avx2(Tensor x, Tensor packed, Tensor scales_and_zeros, bool tail_halves, int group_size) -> "
        "Tensor");
  m.def("linear_int4_avx2(Tensor x, Tensor packed, Tensor scales_and_zeros, bool tail_halves, int group_size) -> "
        "Tensor");
}

TORCH_LIBRARY_IMPL(appliance, CPU, m) {
  m.impl("pack_weight", &pack_weight);
  m.impl("linear_packed", &linear_packed);
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("rms_norm", &rms_norm);
  m.impl("rotary_", &rotary_);
  m.impl("write_kv", &write_kv);
  m.impl("silu_mul", &silu_mul);
  m.impl("argmax_rows", &argmax_rows);
  m.impl("linear_int8", &linear_int8);
  m.impl("linear_bf16w", &linear_bf16w);
  m.impl("int4_tiles_", &int4_tiles_);
  m.impl("linear_int4", &linear_int4);
  m.impl("gemv_int4", &gemv_int4);
  m.impl("gemv_int4_avx2", &gemv_int4_avx2_op);
  m.impl("linear_int4_avx2", &linear_int4_avx2_op);
}
