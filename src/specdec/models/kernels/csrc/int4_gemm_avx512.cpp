// specdec's int4 GEMM for AVX-512 VNNI CPUs: 4-bit weights (about half the bytes of int8 on a memory-bound step),
// the activations quantized per row to int8 as in the int8 kernel (int8_gemm_avx512.cpp), up to 8 rows per weight read.
//
// Weights: llama.cpp's Q4_K arithmetic, w = d * sc * q - dmin * m: q in 0..15 per value, sc and m in 0..63 per
// sub-block of 32 input columns of an output row, d and dmin float16 per super-block of 256 (4.6 bits a weight). A
// GGUF's Q4_K tensors therefore come in exactly (specdec.models.quantized.int4), other weights are quantized into it.
// Layout for each group of 32 output columns: 64 bytes per 4 input columns, byte c * 4 + j holding q[c][k + j] in
// its low nibble and q[c + 16][k + j] in its high one (one 512-bit load gives both 16-column halves: an AND, a
// shift); apart from them [N / 32][K / 256][d 32, dmin 32] float16 and [N / 32][K / 32][sc 32, m 32] uint8.
//
// Exact and block-invariant: a sub-block's integer products are summed exactly in int32 (vpdpbusd: u8 weights
// times the s8 activations); every output element then folds its sub-blocks in in a fixed order,
// f = fma(float(acc), d * sc, f); f = f - float(sum of x_q) * (dmin * m), and y = f * (max|x| / 127) + bias. The
// same operations on the same numbers whatever else shares the pass: a row's output depends on its own input only.
#include <torch/extension.h>
#include "output_parts.h"
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t GROUP4 = 32;   // output columns per packed group
constexpr int64_t SUB = 32;      // input columns per sub-block (one sc, one m)
constexpr int64_t SUPER = 256;   // input columns per super-block (one d, one dmin)
constexpr int64_t ROWS4 = 8;     // activation rows per weight read
constexpr int64_t PREFETCH4 = 1024;

// x [M, K] -> xq [M, Kp] int8 (round(x * (1 / max|x|) * 127), the int8 kernel's arithmetic; zero padding),
// sr [M] (max|x| / 127) and xsum [M, Kp / 32] (each sub-block's sum of xq, exact).
__attribute__((target("avx512f,avx512bw")))
void quantize_rows4(const float* x, int64_t M, int64_t K, int64_t Kp, int8_t* xq, float* sr, int32_t* xsum) {
  const float tiny = std::numeric_limits<float>::min();
  for (int64_t m = 0; m < M; ++m) {
    __m512 vmx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 live = K - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - k)) - 1);
      vmx = _mm512_max_ps(vmx, _mm512_abs_ps(_mm512_maskz_loadu_ps(live, x + m * K + k)));
    }
    const float s = std::max(_mm512_reduce_max_ps(vmx), tiny);
    sr[m] = s / 127.0f;
    const __m512 inv = _mm512_set1_ps((1.0f / s) * 127.0f);
    for (int64_t j = 0; j < Kp / SUB; ++j) {
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = j * SUB; k < (j + 1) * SUB; k += 16) {
        const __mmask16 live = K - k >= 16 ? 0xffff : (k < K ? static_cast<__mmask16>((1u << (K - k)) - 1) : 0);
        const __m512i q = _mm512_cvtps_epi32(_mm512_roundscale_ps(
            _mm512_mul_ps(_mm512_maskz_loadu_ps(live, x + m * K + k), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        sum = _mm512_add_epi32(sum, q);
        _mm512_mask_cvtepi32_storeu_epi8(xq + m * Kp + k, 0xffff, q);
      }
      xsum[m * (Kp / SUB) + j] = _mm512_reduce_add_epi32(sum);
    }
  }
}

__attribute__((target("avx512f")))
inline __m512 bytes_ps(const uint8_t* p) {  // 16 uint8 -> 16 float32
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int MB>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void group_rows4(const uint8_t* wg, const c10::Half* dg, const uint8_t* sg, int64_t Kp, const int8_t* xq,
                 const int32_t* xsum, const float* sr, const float* bias, const Out& out, int64_t m0, int64_t n0) {
  // the float sums: in registers for up to 4 rows; in L1 for more (the registers hold the int32 sums)
  constexpr bool in_registers = MB <= 4;
  __m512 fr[in_registers ? MB : 1][2];
  alignas(64) float fm[in_registers ? 1 : MB][2][16];
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < 2; ++h) {
      if constexpr (in_registers) fr[m][h] = _mm512_setzero_ps();
      else _mm512_store_ps(fm[m][h], _mm512_setzero_ps());
    }
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < Kp / SUPER; ++b) {
    const __m256i* dp = reinterpret_cast<const __m256i*>(dg + b * 2 * GROUP4);
    const __m512 d[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(dp)), _mm512_cvtph_ps(_mm256_loadu_si256(dp + 1))};
    const __m512 dmin[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(dp + 2)), _mm512_cvtph_ps(_mm256_loadu_si256(dp + 3))};
    for (int64_t j = b * (SUPER / SUB); j < (b + 1) * (SUPER / SUB); ++j) {
      __m512i acc[MB][2];
      for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_si512();
      const uint8_t* p = wg + j * (SUB / 4) * 64;
      for (int64_t lane = 0; lane < SUB / 4; ++lane) {
        _mm_prefetch(reinterpret_cast<const char*>(p + lane * 64 + PREFETCH4), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(p + lane * 64);
        const __m512i w0 = _mm512_and_si512(v, low);
        const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int m = 0; m < MB; ++m) {
          const __m512i xb = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xq + m * Kp + j * SUB + lane * 4));
          acc[m][0] = _mm512_dpbusd_epi32(acc[m][0], w0, xb);
          acc[m][1] = _mm512_dpbusd_epi32(acc[m][1], w1, xb);
        }
      }
      const uint8_t* sm = sg + j * 2 * GROUP4;  // [sc 32, m 32]
      const __m512 scale[2] = {_mm512_mul_ps(d[0], bytes_ps(sm)), _mm512_mul_ps(d[1], bytes_ps(sm + 16))};
      const __m512 mins[2] = {_mm512_mul_ps(dmin[0], bytes_ps(sm + 32)), _mm512_mul_ps(dmin[1], bytes_ps(sm + 48))};
      for (int m = 0; m < MB; ++m) {
        const __m512 xs = _mm512_set1_ps(static_cast<float>(xsum[m * (Kp / SUB) + j]));
        for (int h = 0; h < 2; ++h) {
          const __m512 f = in_registers ? fr[m][h] : _mm512_load_ps(fm[m][h]);
          const __m512 t = _mm512_fnmadd_ps(xs, mins[h], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][h]), scale[h], f));
          if constexpr (in_registers) fr[m][h] = t;
          else _mm512_store_ps(fm[m][h], t);
        }
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n = n0 + 16 * h;
    if (n >= out.end) break;
    const int64_t count = std::min<int64_t>(out.end - n, 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
    for (int m = 0; m < MB; ++m) {
      __m512 y = _mm512_mul_ps(in_registers ? fr[m][h] : _mm512_load_ps(fm[m][h]), _mm512_set1_ps(sr[m]));
      if (bias) y = _mm512_add_ps(y, b);
      _mm512_mask_storeu_ps(out.y + (m0 + m) * out.ld + (n - out.start), mask, y);
    }
  }
}

using GroupFn4 = void (*)(const uint8_t*, const c10::Half*, const uint8_t*, int64_t, const int8_t*, const int32_t*,
                          const float*, const float*, const Out&, int64_t, int64_t);
const GroupFn4 GROUP_FNS4[ROWS4 + 1] = {nullptr, group_rows4<1>, group_rows4<2>, group_rows4<3>, group_rows4<4>,
                                        group_rows4<5>, group_rows4<6>, group_rows4<7>, group_rows4<8>};

}  // namespace

// The AVX2 path (gemm_avx2.cpp): the same bits where the CPU has no AVX-512 VNNI.
bool use_avx2();
void quantize_rows4_avx2(const float* x, int64_t M, int64_t K, int64_t Kp, int8_t* xq, float* sr, int32_t* xsum);
void group_rows4_avx2(int64_t rows, const uint8_t* wg, const c10::Half* dg, const uint8_t* sg, int64_t Kp,
                      const int8_t* xq, const int32_t* xsum, const float* sr, const float* bias, const Out& out,
                      int64_t m0, int64_t n0);

// x [M, K] float32; packed [N32 / 32, Kp / 4, 64] uint8, dmins [N32 / 32, Kp / 256, 64] float16 (d 32, dmin 32),
// scs [N32 / 32, Kp / 32, 64] uint8 (sc 32, m 32); bias [N] or None -> one float32 [M, w_i] per part of `widths`
// (empty: one part of N columns; each part but the last starting at a multiple of 32 columns).
std::vector<torch::Tensor> rows4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& dmins,
                                 const torch::Tensor& scs, const c10::optional<torch::Tensor>& bias, int64_t N,
                                 const std::vector<int64_t>& widths) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 64 && packed.scalar_type() == torch::kByte &&
              packed.is_contiguous(), "packed: [N/32, K/4, 64] uint8");
  const int64_t M = x.size(0), K = x.size(1), Kp = packed.size(1) * 4, groups = packed.size(0);
  TORCH_CHECK(Kp % SUPER == 0 && K <= Kp && Kp - K < SUPER, "x has ", K, " columns; the int4 weight takes ", Kp);
  TORCH_CHECK(dmins.scalar_type() == torch::kHalf && dmins.is_contiguous() && dmins.numel() == groups * Kp / SUPER * 64 &&
              scs.scalar_type() == torch::kByte && scs.is_contiguous() && scs.numel() == groups * Kp / SUB * 64,
              "dmins: [N/32, K/256, 64] float16 and scs: [N/32, K/32, 64] uint8");
  std::vector<Out> outs;  // per group: its part
  auto ys = output_parts(x, M, N, groups, widths, GROUP4, "rows4", bias, outs);
  if (M == 0) return ys;
  std::vector<int8_t> xq(M * Kp);
  std::vector<float> sr(M);
  std::vector<int32_t> xsum(M * (Kp / SUB));
  const bool avx2 = use_avx2();
  (avx2 ? quantize_rows4_avx2 : quantize_rows4)(x.data_ptr<float>(), M, K, Kp, xq.data(), sr.data(), xsum.data());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  const c10::Half* D = dmins.data_ptr<c10::Half>();
  const uint8_t* S = scs.data_ptr<uint8_t>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // a pass of up to 8 rows reads each weight once; a longer one (a prefill) goes 4 rows at a time, its float
  // sums in registers (measured on the AVX-512 EPYC: 130 rows 20% faster so, 5 rows 10% slower)
  const int64_t step = M <= ROWS4 ? ROWS4 : 4;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t m0 = 0; m0 < M; m0 += avx2 ? M : step) {  // (the AVX2 code takes its own row chunks)
        const int64_t mb = avx2 ? M : std::min(step, M - m0);
        const uint8_t* wg = W + g * Kp / 4 * 64;
        const c10::Half* dg = D + g * Kp / SUPER * 64;
        const uint8_t* sg = S + g * Kp / SUB * 64;
        if (avx2)
          group_rows4_avx2(mb, wg, dg, sg, Kp, xq.data() + m0 * Kp, xsum.data() + m0 * (Kp / SUB), sr.data() + m0, bp,
                           outs[g], m0, g * GROUP4);
        else
          GROUP_FNS4[mb](wg, dg, sg, Kp, xq.data() + m0 * Kp, xsum.data() + m0 * (Kp / SUB), sr.data() + m0, bp, outs[g],
                         m0, g * GROUP4);
      }
  });
  return ys;
}

// A float32 weight [N, K] quantized into the Q4_K form, K padded with zeros to a multiple of 256: per sub-block of
// 32, lo = min(0, min w), scale = (max w - lo) / 15; per super-block d = max scale / 63 and dmin = max(-lo) / 63 in
// float16, sc = round(scale / d) and m = round(-lo / dmin) (0..63); q = round((w + dmin * m) / (d * sc)) in 0..15.
// -> (q [N, Kp] uint8, d [N, Kp / 256] float16, dmin [same], sc [N, Kp / 32] uint8, m [same]).
std::vector<torch::Tensor> quantize4(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32, "quantize4: a float32 [N, K] weight");
  const auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), Kp = (K + SUPER - 1) / SUPER * SUPER;
  auto q = torch::zeros({N, Kp}, torch::kByte), sc = torch::zeros({N, Kp / SUB}, torch::kByte);
  auto mm = torch::zeros({N, Kp / SUB}, torch::kByte);
  auto d = torch::zeros({N, Kp / SUPER}, torch::kHalf), dmin = torch::zeros({N, Kp / SUPER}, torch::kHalf);
  const float* W = w.data_ptr<float>();
  uint8_t *Q = q.data_ptr<uint8_t>(), *SC = sc.data_ptr<uint8_t>(), *MM = mm.data_ptr<uint8_t>();
  c10::Half *DD = d.data_ptr<c10::Half>(), *DM = dmin.data_ptr<c10::Half>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < Kp / SUPER; ++b) {
        float scale[SUPER / SUB], neg_lo[SUPER / SUB], max_scale = 0.0f, max_neg = 0.0f;
        for (int64_t j = 0; j < SUPER / SUB; ++j) {
          float lo = 0.0f, hi = -std::numeric_limits<float>::infinity();
          for (int64_t k = b * SUPER + j * SUB; k < b * SUPER + (j + 1) * SUB; ++k) {
            const float v = k < K ? W[n * K + k] : 0.0f;
            lo = std::min(lo, v), hi = std::max(hi, v);
          }
          scale[j] = (hi - lo) / 15.0f, neg_lo[j] = -lo;
          max_scale = std::max(max_scale, scale[j]), max_neg = std::max(max_neg, neg_lo[j]);
        }
        const c10::Half dh = max_scale / 63.0f, dminh = max_neg / 63.0f;
        DD[n * (Kp / SUPER) + b] = dh, DM[n * (Kp / SUPER) + b] = dminh;
        for (int64_t j = 0; j < SUPER / SUB; ++j) {
          const float df = dh, dminf = dminh;
          const float s6 = df > 0.0f ? std::min(63.0f, std::nearbyint(scale[j] / df)) : 0.0f;
          const float m6 = dminf > 0.0f ? std::min(63.0f, std::nearbyint(neg_lo[j] / dminf)) : 0.0f;
          SC[n * (Kp / SUB) + b * 8 + j] = static_cast<uint8_t>(s6);
          MM[n * (Kp / SUB) + b * 8 + j] = static_cast<uint8_t>(m6);
          const float step = df * s6, offset = dminf * m6;
          for (int64_t k = b * SUPER + j * SUB; k < b * SUPER + (j + 1) * SUB; ++k) {
            const float v = k < K ? W[n * K + k] : 0.0f;
            const float u = step > 0.0f ? std::nearbyint((v + offset) / step) : 0.0f;
            Q[n * Kp + k] = static_cast<uint8_t>(std::min(15.0f, std::max(0.0f, u)));
          }
        }
      }
  });
  return {q, d, dmin, sc, mm};
}

// (q [N, Kp] uint8, d, dmin [N, Kp / 256] float16, sc, m [N, Kp / 32] uint8) -> the kernel's (packed, dmins, scs),
// N padded to 32 with zeros.
std::vector<torch::Tensor> layout4(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& dmin,
                                   const torch::Tensor& sc, const torch::Tensor& m) {
  const int64_t N = q.size(0), Kp = q.size(1), groups = (N + GROUP4 - 1) / GROUP4;
  TORCH_CHECK(q.scalar_type() == torch::kByte && Kp % SUPER == 0 && d.size(0) == N && d.size(1) == Kp / SUPER &&
              dmin.sizes() == d.sizes() && sc.size(0) == N && sc.size(1) == Kp / SUB && m.sizes() == sc.sizes() &&
              d.scalar_type() == torch::kHalf && dmin.scalar_type() == torch::kHalf &&
              sc.scalar_type() == torch::kByte && m.scalar_type() == torch::kByte,
              "layout4: q [N, K] uint8 (K a multiple of 256), d and dmin [N, K/256] float16, sc and m [N, K/32] uint8");
  const auto qc = q.contiguous(), dc = d.contiguous(), dminc = dmin.contiguous(), scc = sc.contiguous(), mc = m.contiguous();
  auto packed = torch::zeros({groups, Kp / 4, 64}, torch::kByte);
  auto dmins = torch::zeros({groups, Kp / SUPER, 2 * GROUP4}, torch::kHalf);
  auto scs = torch::zeros({groups, Kp / SUB, 2 * GROUP4}, torch::kByte);
  uint8_t* P = packed.data_ptr<uint8_t>();
  c10::Half* D = dmins.data_ptr<c10::Half>();
  uint8_t* S = scs.data_ptr<uint8_t>();
  const uint8_t *Q = qc.data_ptr<uint8_t>(), *SC = scc.data_ptr<uint8_t>(), *MM = mc.data_ptr<uint8_t>();
  const c10::Half *DD = dc.data_ptr<c10::Half>(), *DM = dminc.data_ptr<c10::Half>();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {  // (a byte holds rows c and c + 16: one thread)
    for (int64_t n = g0 * GROUP4; n < std::min(N, g1 * GROUP4); ++n) {
      const int64_t grp = n / GROUP4, c = n % GROUP4, shift = c / 16 ? 4 : 0, col = c % 16;
      for (int64_t k = 0; k < Kp; ++k)
        P[(grp * (Kp / 4) + k / 4) * 64 + col * 4 + k % 4] |= static_cast<uint8_t>((Q[n * Kp + k] & 15) << shift);
      for (int64_t b = 0; b < Kp / SUPER; ++b) {
        D[(grp * (Kp / SUPER) + b) * 2 * GROUP4 + c] = DD[n * (Kp / SUPER) + b];
        D[(grp * (Kp / SUPER) + b) * 2 * GROUP4 + GROUP4 + c] = DM[n * (Kp / SUPER) + b];
      }
      for (int64_t j = 0; j < Kp / SUB; ++j) {
        S[(grp * (Kp / SUB) + j) * 2 * GROUP4 + c] = SC[n * (Kp / SUB) + j];
        S[(grp * (Kp / SUB) + j) * 2 * GROUP4 + GROUP4 + c] = MM[n * (Kp / SUB) + j];
      }
    }
  });
  return {packed, dmins, scs};
}
