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
//
// Where the CPU has AMX, a pass of AMX4_FROM rows or more takes a sub-block's int32 sums from AMX tiles instead
// (TDPBSUD: the s8 activations, 16 rows x 32 columns, times the weights' nibbles, which are a tile's VNNI layout as
// they stand: 4 input columns x 16 output columns a 64-byte row): the same exact sums, folded in the same order, so
// the same bits (tested), with one tile instruction per 16 rows x 16 columns x 32 inputs where vpdpbusd needs 128.
#include <torch/extension.h>
#include "output_parts.h"
#include "amx_tiles.h"
#include "work_items.h"
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
constexpr int64_t AMX4_FROM = 16;  // the fewest rows a pass runs on AMX tiles (measured on the AMX Xeon)
constexpr int64_t AMX4_ROWS = 16, AMX4_CHUNK = 64;  // rows per A tile; rows a pass over a group's weights takes
constexpr int64_t AMX4_TAIL = 4;  // rows past whole tile blocks that go on vpdpbusd rather than in a padded block

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

// Row m's float sums for the 16 output columns n on (fewer at the end): y = f * sr + bias, into its part (both
// paths end here, so their bits are the same).
__attribute__((target("avx512f")))
inline void store_sums(__m512 f, float sr, const float* bias, const Out& out, int64_t m, int64_t n) {
  const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(out.end - n, 16)) - 1);
  __m512 y = _mm512_mul_ps(f, _mm512_set1_ps(sr));
  if (bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, bias + n));
  _mm512_mask_storeu_ps(out.y + m * out.ld + (n - out.start), mask, y);
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
  for (int h = 0; h < 2 && n0 + 16 * h < out.end; ++h)
    for (int m = 0; m < MB; ++m)
      store_sums(in_registers ? fr[m][h] : _mm512_load_ps(fm[m][h]), sr[m], bias, out, m0 + m, n0 + 16 * h);
}

// ---- AMX: a sub-block's exact sums through tiles ----

// Two sets of tiles, one tile block's sums in the one while the other's fold (the fold waits on its tile stores):
// tiles 0, 1 and 5, 6: the sums (16 rows x 16 int32, output columns 0-15 and 16-31); 2 and 7: the activations (16
// rows x 32 bytes); 3, 4: the sub-block's weights (8 lanes x 64 bytes: the low nibbles, the high ones).
void configure_tiles4() {
  const uint8_t rows[8] = {AMX4_ROWS, AMX4_ROWS, AMX4_ROWS, SUB / 4, SUB / 4, AMX4_ROWS, AMX4_ROWS, AMX4_ROWS};
  const uint16_t colsb[8] = {64, 64, SUB, 64, 64, 64, 64, SUB};
  configure(rows, colsb, 8);
}

// One tile block's exact sums into acc [2][16][16]: tiles C0, C1 the sums, A the activations (16 rows of xq at a
// stride of Kp), 3 and 4 the weights. (A macro: gcc's tile intrinsics take the tile numbers as literals.)
#define SPECDEC_TILE_SUMS(NAME, C0, C1, A)                                    \
  __attribute__((target("amx-tile,amx-int8")))                               \
  inline void NAME(const int8_t* x, int64_t Kp, int32_t* acc) {               \
    _tile_zero(C0);                                                           \
    _tile_zero(C1);                                                           \
    _tile_loadd(A, x, Kp);                                                    \
    _tile_dpbsud(C0, A, 3);                                                   \
    _tile_dpbsud(C1, A, 4);                                                   \
    _tile_stored(C0, acc, 64);                                                \
    _tile_stored(C1, acc + AMX4_ROWS * 16, 64);                               \
  }
SPECDEC_TILE_SUMS(tile_sums0, 0, 1, 2)
SPECDEC_TILE_SUMS(tile_sums1, 5, 6, 7)

// A tile block's sums waiting to be folded: its rows [first, end) of the chunk, its sub-block, scales and buffer.
struct Pending4 {
  int64_t first = 0, end = 0, j = 0;
  __m512 scale[2], mins[2];
  const int32_t* acc = nullptr;
};

// f[m][h] = f - xs * mins + sums * scale for the pending block's rows: group_rows4's fold, operation for operation.
__attribute__((target("avx512f")))
inline void fold4(const Pending4& p, const int32_t* xsum, int64_t Kp, int64_t m0, float (*f)[2][16]) {
  for (int64_t m = p.first; m < p.end; ++m) {
    const __m512 xs = _mm512_set1_ps(static_cast<float>(xsum[(m0 + m) * (Kp / SUB) + p.j]));
    for (int h = 0; h < 2; ++h) {
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_load_si512(p.acc + (h * AMX4_ROWS + m - p.first) * 16));
      const __m512 t = _mm512_fmadd_ps(sums, p.scale[h], _mm512_load_ps(f[m][h]));
      _mm512_store_ps(f[m][h], _mm512_fnmadd_ps(xs, p.mins[h], t));
    }
  }
}

// One group of 32 output columns for `rows` (<= AMX4_CHUNK) activation rows m0 on; xq holds whole tiles of
// AMX4_ROWS rows (zeros past M); tiles configured (configure_tiles4). Per sub-block, per 16 rows, the sums fold into
// f exactly as group_rows4 folds them, in the same order.
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))
void group_amx4(const uint8_t* wg, const c10::Half* dg, const uint8_t* sg, int64_t Kp, const int8_t* xq, int64_t rows,
                const int32_t* xsum, const float* sr, const float* bias, const Out& out, int64_t m0, int64_t n0) {
  alignas(64) float f[AMX4_CHUNK][2][16];
  alignas(64) uint8_t wb[2][SUB / 4][64];  // the sub-block's weights: columns 0-15 (low nibbles), 16-31 (high)
  alignas(64) int32_t acc[2][2 * AMX4_ROWS * 16];  // per tile set: a block's sums, columns 0-15 then 16-31
  for (int64_t m = 0; m < rows; ++m)
    for (int h = 0; h < 2; ++h) _mm512_store_ps(f[m][h], _mm512_setzero_ps());
  const __m512i low = _mm512_set1_epi8(0x0F);
  Pending4 pending;
  int set = 0;  // the tile set of the next block
  for (int64_t b = 0; b < Kp / SUPER; ++b) {
    const __m256i* dp = reinterpret_cast<const __m256i*>(dg + b * 2 * GROUP4);
    const __m512 d[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(dp)), _mm512_cvtph_ps(_mm256_loadu_si256(dp + 1))};
    const __m512 dmin[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(dp + 2)), _mm512_cvtph_ps(_mm256_loadu_si256(dp + 3))};
    for (int64_t j = b * (SUPER / SUB); j < (b + 1) * (SUPER / SUB); ++j) {
      const uint8_t* p = wg + j * (SUB / 4) * 64;
      for (int64_t lane = 0; lane < SUB / 4; ++lane) {
        _mm_prefetch(reinterpret_cast<const char*>(p + lane * 64 + PREFETCH4), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(p + lane * 64);
        _mm512_store_si512(wb[0][lane], _mm512_and_si512(v, low));
        _mm512_store_si512(wb[1][lane], _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
      }
      _tile_loadd(3, wb[0], 64);
      _tile_loadd(4, wb[1], 64);
      const uint8_t* sm = sg + j * 2 * GROUP4;  // [sc 32, m 32]
      Pending4 next;
      for (int h = 0; h < 2; ++h) {
        next.scale[h] = _mm512_mul_ps(d[h], bytes_ps(sm + 16 * h));
        next.mins[h] = _mm512_mul_ps(dmin[h], bytes_ps(sm + 32 + 16 * h));
      }
      next.j = j;
      for (int64_t t = 0; t < rows; t += AMX4_ROWS) {
        const int8_t* x = xq + (m0 + t) * Kp + j * SUB;
        if (set) tile_sums1(x, Kp, acc[1]);
        else tile_sums0(x, Kp, acc[0]);
        if (pending.acc) fold4(pending, xsum, Kp, m0, f);  // (the block before, while this one's sums come)
        next.first = t, next.end = std::min(rows, t + AMX4_ROWS), next.acc = acc[set];
        pending = next;
        set ^= 1;
      }
    }
  }
  fold4(pending, xsum, Kp, m0, f);
  for (int h = 0; h < 2 && n0 + 16 * h < out.end; ++h)
    for (int64_t m = 0; m < rows; ++m) store_sums(_mm512_load_ps(f[m][h]), sr[m0 + m], bias, out, m0 + m, n0 + 16 * h);
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
// (empty: one part of N columns; each part but the last starting at a multiple of 32 columns). amx_from: 0 never
// uses AMX tiles; else passes of at least max(amx_from, AMX4_FROM) rows do where the CPU has them (the same bits).
std::vector<torch::Tensor> rows4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& dmins,
                                 const torch::Tensor& scs, const c10::optional<torch::Tensor>& bias, int64_t N,
                                 int64_t amx_from, const std::vector<int64_t>& widths) {
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
  const bool avx2 = use_avx2();
  const bool amx = !avx2 && amx_from > 0 && M >= std::max(amx_from, AMX4_FROM) && has_amx();
  std::vector<int8_t> xq((amx ? (M + AMX4_ROWS - 1) / AMX4_ROWS * AMX4_ROWS : M) * Kp);  // (zeros: whole tiles)
  std::vector<float> sr(M);
  std::vector<int32_t> xsum(M * (Kp / SUB));
  (avx2 ? quantize_rows4_avx2 : quantize_rows4)(x.data_ptr<float>(), M, K, Kp, xq.data(), sr.data(), xsum.data());
  const uint8_t* W = packed.data_ptr<uint8_t>();
  const c10::Half* D = dmins.data_ptr<c10::Half>();
  const uint8_t* S = scs.data_ptr<uint8_t>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // a pass of up to 8 rows reads each weight once; a longer one (a prefill) goes 4 rows at a time, its float
  // sums in registers (measured on the AVX-512 EPYC: 130 rows 20% faster so, 5 rows 10% slower)
  const int64_t step = M <= ROWS4 ? ROWS4 : 4;
  if (amx) {  // whole tile blocks; a tail of up to AMX4_TAIL rows on vpdpbusd (a tile block costs as much as 16)
    const int64_t tiled = M % AMX4_ROWS <= AMX4_TAIL ? M / AMX4_ROWS * AMX4_ROWS : M;
    share_groups(groups, [&](auto take) {
      configure_tiles4();
      for (int64_t g; (g = take()) >= 0;) {
        const uint8_t* wg = W + g * Kp / 4 * 64;
        const c10::Half* dg = D + g * Kp / SUPER * 64;
        const uint8_t* sg = S + g * Kp / SUB * 64;
        for (int64_t m0 = 0; m0 < tiled; m0 += AMX4_CHUNK)
          group_amx4(wg, dg, sg, Kp, xq.data(), std::min(AMX4_CHUNK, tiled - m0), xsum.data(), sr.data(), bp, outs[g],
                     m0, g * GROUP4);
        if (tiled < M)  // (the group's weights are in cache now)
          GROUP_FNS4[M - tiled](wg, dg, sg, Kp, xq.data() + tiled * Kp, xsum.data() + tiled * (Kp / SUB),
                                sr.data() + tiled, bp, outs[g], tiled, g * GROUP4);
      }
      release_tiles();
    });
    return ys;
  }
  share_groups(groups, [&](auto take) {
    for (int64_t g; (g = take()) >= 0;)
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
