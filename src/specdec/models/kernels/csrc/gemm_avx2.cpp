// specdec's kernels for CPUs with AVX2 (and FMA, F16C) but no AVX-512 VNNI: the int8 and int4 GEMMs and their row
// quantization of int8_gemm_avx512.cpp and int4_gemm_avx512.cpp, with the same bits (the row attention: attention_avx2.cpp).
//
// The integer sums are exact either way: vpdpbusd's four u8 x s8 products per int32 lane become vpmaddubsw (int4: q
// in 0..15 times int8, so a pair sums to at most 3,810: no int16 saturation) or vpmaddwd on int16 (int8: the
// activation byte q + 128 and the weight widened to int16) and vpmaddwd. Every float operation is the AVX-512 code's,
// lane for lane, in the same order (a 16-lane register is two 8-lane halves; its horizontal sums follow GCC's
// _mm512_reduce_add_ps, the compiler torch's extensions build with here), so the kernels give the same outputs on
// either path (tests/test_avx2_kernels.py compares them, and a model's logits, on one machine). The process picks
// the path once (set_avx2, from specdec.models.kernels.extension.kernel_isa).
#include <torch/extension.h>
#include "output_parts.h"
#include "avx2_lanes.h"
#include <c10/util/Half.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {
bool avx2_path = false;
std::atomic<bool> six_row_chunks{true};  // group_rows4_avx2's chunks (false: 5 rows a call, 4 in two passes: before)
std::atomic<int64_t> avx2_call_count{0};  // kernel calls that ran the AVX2 code (what the tests check)
}

void set_avx2(bool on) { avx2_path = on; }
bool use_avx2() { return avx2_path; }
void count_avx2_call() { avx2_call_count.fetch_add(1, std::memory_order_relaxed); }
int64_t avx2_calls() { return avx2_call_count.load(); }
void set_row_chunks4_avx2(bool six) { six_row_chunks.store(six, std::memory_order_relaxed); }

namespace {

__attribute__((target("avx2,fma")))
inline __m256 max_abs(__m256 acc, const float* x, int64_t count) {
  const __m256 v = _mm256_maskload_ps(x, live8(count));
  return _mm256_max_ps(acc, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v));
}

// round(x * inv) as the AVX-512 code rounds it (nearest, ties to even), 8 lanes, count live (others 0).
__attribute__((target("avx2,fma")))
inline __m256i rounded(const float* x, int64_t count, __m256 inv) {
  const __m256 v = _mm256_maskload_ps(x, live8(count));
  return _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 32 values in four vectors of 8 int32 lanes (a, b, c, d in order, each lane in byte range) as 32 bytes in that
// order: int8 (packs) or, UNSIGNED, uint8 (packus). The packs interleave 4-lane pieces per 128-bit half; the
// permutation puts them back.
template <bool UNSIGNED>
__attribute__((target("avx2,fma")))
inline __m256i bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  const __m256i packed = UNSIGNED ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

__attribute__((target("avx2,fma")))
float row_max(const float* x, int64_t K) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) lo = max_abs(lo, x + k, K - k), hi = max_abs(hi, x + k + 8, K - k - 8);
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, lo), _mm256_store_ps(h, hi);
  float mx = 0.0f;
  for (int i = 0; i < 8; ++i) mx = std::max(mx, std::max(l[i], h[i]));  // (a maximum is exact in any order)
  return mx;
}

}  // namespace

// ---- int8 (int8_gemm_avx512.cpp's rows) ----

// quantize_rows's bits: xu [M, K4] = round(x * (1 / s) * 127) + 128 (padding 128), s [M] the row (or pass) maxima.
__attribute__((target("avx2,fma")))
void quantize_rows_avx2(const float* x, int64_t M, int64_t K, int64_t K4, bool per_pass, uint8_t* xu, float* s) {
  count_avx2_call();
  const float tiny = std::numeric_limits<float>::min();
  float pass_max = 0.0f;
  for (int64_t m = 0; m < M; ++m) pass_max = std::max(pass_max, s[m] = std::max(row_max(x + m * K, K), tiny));
  for (int64_t m = 0; m < M; ++m) {
    if (per_pass) s[m] = pass_max;
    const __m256 inv = _mm256_set1_ps((1.0f / s[m]) * 127.0f);
    const float* xm = x + m * K;
    for (int64_t k = 0; k < K4; k += 32) {  // 32 bytes at a time, each 1..255 (128 past K)
      const __m256i off = _mm256_set1_epi32(128);
      const __m256i a = _mm256_add_epi32(rounded(xm + k, K - k, inv), off);
      const __m256i b = _mm256_add_epi32(rounded(xm + k + 8, K - k - 8, inv), off);
      const __m256i c = _mm256_add_epi32(rounded(xm + k + 16, K - k - 16, inv), off);
      const __m256i d = _mm256_add_epi32(rounded(xm + k + 24, K - k - 24, inv), off);
      const __m256i bytes = bytes32<true>(a, b, c, d);
      if (k + 32 <= K4) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xu + m * K4 + k), bytes);
      } else {  // the row's last K4 % 32 bytes
        alignas(32) uint8_t tail[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(tail), bytes);
        std::memcpy(xu + m * K4 + k, tail, K4 - k);
      }
    }
  }
}

namespace {

constexpr int64_t PREFETCH = 2048;  // bytes ahead in the int8 weight stream (int8_gemm_avx512.cpp's distance)

// The int8 kernel's store_row for 8 columns: y = (float(acc - colsum128) * sq) * s + bias.
__attribute__((target("avx2,fma")))
inline void store8(__m256i acc, const int32_t* cs, const float* sq, float s, const float* bias, const Out& out,
                   int64_t m, int64_t n0) {
  const __m256i live = live8(out.end - n0);
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, _mm256_maskload_epi32(cs + n0, live))),
                           _mm256_maskload_ps(sq + n0, live));
  f = _mm256_mul_ps(f, _mm256_set1_ps(s));
  if (bias) f = _mm256_add_ps(f, _mm256_maskload_ps(bias + n0, live));
  _mm256_maskstore_ps(out.y + m * out.ld + (n0 - out.start), live, f);
}

// One group of 32 columns for MB (<= 4) rows, 8 * CW columns a pass (CW = 4 / MB: every byte of a weight line used
// in the pass that loads it, 8 accumulators): per 4-column lane the weight bytes of 8 columns widened to int16
// (columns c..c+3, c+4..c+7), times the rows' 4 activation bytes as int16 (vpmaddwd: two products a lane), the pairs
// added at the end: the int32 sums of vpdpbusd.
template <int MB, int CW>
__attribute__((target("avx2,fma")))
void group8(const int8_t* wg, int64_t KB, const int16_t* x16, int64_t K4, const int32_t* cs, const float* sq,
            const float* s, const float* bias, const Out& out, int64_t m0, int64_t n0) {
  for (int64_t c0 = 0; c0 < 32; c0 += 8 * CW) {
    if (n0 + c0 >= out.end) break;
    __m256i lo[MB][CW], hi[MB][CW];
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < CW; ++u) lo[m][u] = hi[m][u] = _mm256_setzero_si256();
    for (int64_t kb = 0; kb < KB; ++kb) {
      if (c0 == 0) {  // the next passes over this group read these lines from the cache
        _mm_prefetch(reinterpret_cast<const char*>(wg + kb * 128 + PREFETCH), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wg + kb * 128 + PREFETCH + 64), _MM_HINT_T0);
      }
      for (int u = 0; u < CW; ++u) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + kb * 128 + (c0 + 8 * u) * 4));
        const __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
        const __m256i wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
        for (int m = 0; m < MB; ++m) {
          int64_t four;
          std::memcpy(&four, x16 + m * K4 + kb * 4, 8);
          const __m256i xv = _mm256_set1_epi64x(four);
          lo[m][u] = _mm256_add_epi32(lo[m][u], _mm256_madd_epi16(wl, xv));
          hi[m][u] = _mm256_add_epi32(hi[m][u], _mm256_madd_epi16(wh, xv));
        }
      }
    }
    for (int u = 0; u < CW; ++u) {
      if (n0 + c0 + 8 * u >= out.end) break;
      for (int m = 0; m < MB; ++m)  // pairs (c, c+1, c+4, c+5 | c+2, c+3, c+6, c+7) -> columns c..c+7 in order
        store8(_mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[m][u], hi[m][u]), 0xD8), cs, sq, s[m], bias, out, m0 + m,
               n0 + c0 + 8 * u);
    }
  }
}

}  // namespace

// The int8 GEMM's group loop body on AVX2: `rows` (<= 8) activation rows of xu [.., K4] (as quantize_rows wrote
// them) against one packed group.
void group_rows_avx2(int64_t rows, const int8_t* wg, int64_t KB, const int16_t* x16, int64_t K4, const int32_t* cs,
                     const float* sq, const float* s, const float* bias, const Out& out, int64_t m0, int64_t n0) {
  using Fn = void (*)(const int8_t*, int64_t, const int16_t*, int64_t, const int32_t*, const float*, const float*,
                      const float*, const Out&, int64_t, int64_t);
  static const Fn fns[5] = {nullptr, group8<1, 4>, group8<2, 2>, group8<3, 1>, group8<4, 1>};
  for (int64_t r = 0; r < rows; r += 4) {
    const int64_t mb = std::min<int64_t>(4, rows - r);
    fns[mb](wg, KB, x16 + r * K4, K4, cs, sq, s + r, bias, out, m0 + r, n0);
  }
}

// ---- int4 (int4_gemm_avx512.cpp's rows4) ----

// quantize_rows4's bits: xq [M, Kp] int8, sr [M] = max|x| / 127, xsum [M, Kp / 32] (each sub-block's sum).
__attribute__((target("avx2,fma")))
void quantize_rows4_avx2(const float* x, int64_t M, int64_t K, int64_t Kp, int8_t* xq, float* sr, int32_t* xsum) {
  count_avx2_call();
  const float tiny = std::numeric_limits<float>::min();
  for (int64_t m = 0; m < M; ++m) {
    const float s = std::max(row_max(x + m * K, K), tiny);
    sr[m] = s / 127.0f;
    const __m256 inv = _mm256_set1_ps((1.0f / s) * 127.0f);
    const float* xm = x + m * K;
    for (int64_t j = 0; j < Kp / 32; ++j) {
      const int64_t k = j * 32;  // one sub-block: four vectors of 8, each lane in -127..127
      const __m256i a = rounded(xm + k, K - k, inv), b = rounded(xm + k + 8, K - k - 8, inv);
      const __m256i c = rounded(xm + k + 16, K - k - 16, inv), d = rounded(xm + k + 24, K - k - 24, inv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + m * Kp + k), bytes32<false>(a, b, c, d));
      const __m256i t = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));  // (exact: small ints)
      const __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
      const __m128i v = _mm_add_epi32(u, _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 0, 3, 2)));
      xsum[m * (Kp / 32) + j] = _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1))));
    }
  }
}

namespace {

constexpr int64_t PREFETCH4 = 2048;  // bytes ahead in the int4 weight stream (measured on Zen 4: 1024 slower,
                                     // 4096 no faster)

__attribute__((target("avx2,fma,f16c")))
inline __m256 halves8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx2,fma")))
inline __m256 bytes8(const uint8_t* p) {
  int64_t eight;
  std::memcpy(&eight, p, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight)));
}

// One group of 32 columns for MB (<= 8) rows, in 2 / NH passes over the weights of NH column halves each (half h:
// c0 + 8h .. + 7 in the low nibbles of bytes 32h .. 32h + 31, c0 + 16 + 8h .. in their high nibbles): per sub-block
// the exact int32 sums (vpmaddubsw, then vpmaddwd with ones), folded into the float sums exactly as group_rows4 folds
// them. NH = 2 (one to four rows) reads each 64-byte line once, its two 32-byte halves in turn (12 sums, the half's
// two nibble sets, the mask and a broadcast: 16 registers at 3 rows; at 4 a few sums spill); NH = 1 holds half the
// sums a row (5 rows: 10 sums; 6 to 8 spill some, and still cost less a row: group_rows4_avx2's chunks).
template <int MB, int NH>
__attribute__((target("avx2,fma,f16c")))
void group4(const uint8_t* wg, const c10::Half* dg, const uint8_t* sg, int64_t Kp, const int8_t* xq,
            const int32_t* xsum, const float* sr, const float* bias, const Out& out, int64_t m0, int64_t n0) {
  constexpr int S = 2 * NH;  // column sets of 8 a pass
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int first = 0; first < 2; first += NH) {
    int64_t cols[S];  // per half: the low nibbles' columns, the high nibbles'
    for (int q = 0; q < NH; ++q) cols[2 * q] = (first + q) * 8, cols[2 * q + 1] = 16 + (first + q) * 8;
    alignas(32) float f[MB][S][8] = {};
    for (int64_t b = 0; b < Kp / 256; ++b) {
      const c10::Half* dp = dg + b * 64;  // [d 32, dmin 32]
      __m256 d[S], dmin[S];
      for (int h = 0; h < S; ++h) d[h] = halves8(dp + cols[h]), dmin[h] = halves8(dp + 32 + cols[h]);
      for (int64_t j = b * 8; j < (b + 1) * 8; ++j) {
        // int16 sums of the 8 lanes' vpmaddubsw pairs: each pair at most 15 * 127 * 2 = 3,810 in size, 8 of them
        // 30,480: exact in int16; one vpmaddwd with ones then gives vpdpbusd's int32 sums
        __m256i acc[MB][S];
        for (int m = 0; m < MB; ++m)
          for (int h = 0; h < S; ++h) acc[m][h] = _mm256_setzero_si256();
        const uint8_t* p = wg + j * 8 * 64 + first * 32;
#pragma GCC unroll 1
        for (int64_t lane = 0; lane < 8; ++lane) {
          if (first == 0) _mm_prefetch(reinterpret_cast<const char*>(p + lane * 64 + PREFETCH4), _MM_HINT_T0);
          for (int q = 0; q < NH; ++q) {  // one 32-byte half at a time: its two nibble sets, every row
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + lane * 64 + q * 32));
            const __m256i w[2] = {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
            for (int m = 0; m < MB; ++m) {
              int32_t four;
              std::memcpy(&four, xq + m * Kp + j * 32 + lane * 4, 4);
              const __m256i xb = _mm256_set1_epi32(four);
              for (int h = 0; h < 2; ++h) {
                acc[m][2 * q + h] = _mm256_add_epi16(acc[m][2 * q + h], _mm256_maddubs_epi16(w[h], xb));
                // (keeps the sums in registers: unrolled, GCC stored all 64 products to add them up as a tree,
                // about 25% slower for 4 rows or more)
                asm("" : "+x"(acc[m][2 * q + h]));
              }
            }
          }
        }
        for (int m = 0; m < MB; ++m)
          for (int h = 0; h < S; ++h) acc[m][h] = _mm256_madd_epi16(acc[m][h], ones);
        const uint8_t* sm = sg + j * 64;  // [sc 32, m 32]
        __m256 scale[S], mins[S];
        for (int h = 0; h < S; ++h) {
          scale[h] = _mm256_mul_ps(d[h], bytes8(sm + cols[h]));
          mins[h] = _mm256_mul_ps(dmin[h], bytes8(sm + 32 + cols[h]));
        }
        for (int m = 0; m < MB; ++m) {
          const __m256 xs = _mm256_set1_ps(static_cast<float>(xsum[m * (Kp / 32) + j]));
          for (int h = 0; h < S; ++h)
            _mm256_store_ps(f[m][h], _mm256_fnmadd_ps(xs, mins[h], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[m][h]),
                                                                                   scale[h], _mm256_load_ps(f[m][h]))));
        }
      }
    }
    for (int h = 0; h < S; ++h) {
      const int64_t n = n0 + cols[h];
      if (n >= out.end) continue;
      const __m256i live = live8(out.end - n);
      const __m256 bv = bias ? _mm256_maskload_ps(bias + n, live) : _mm256_setzero_ps();
      for (int m = 0; m < MB; ++m) {
        __m256 y = _mm256_mul_ps(_mm256_load_ps(f[m][h]), _mm256_set1_ps(sr[m]));
        if (bias) y = _mm256_add_ps(y, bv);
        _mm256_maskstore_ps(out.y + (m0 + m) * out.ld + (n - out.start), live, y);
      }
    }
  }
}

}  // namespace

// The row chunks of an M-row pass, each one call of group4 over the group (its weights in cache after the first).
// group4 alone, one thread, hot weights, on the AVX2 EPYC (Zen 3, 2026-12-08), per row relative to 5 rows: 1 row 2.0,
// 2 rows 1.15, 3 1.04, 4 in one pass 1.03 (in two 1.12), 6 0.92, 7 0.96, 8 0.98. So up to 8 rows go in one call, and
// a wider pass (a prefill, a long prediction) in 6-row calls until at most 8 are left: 9 = 6 + 3, 13 = 6 + 7, 14 =
// 6 + 8 (never a lone row at twice the cost a row). The 1.5B's cached pass against 5-row calls
// (scripts/int4_row_chunks.py, pairs alternated): 4 tokens 0.91x, 6 0.90x, 7 0.95x, 8 0.96x, 12 0.94x, 32 0.99x.
// (set_row_chunks4_avx2(false): the chunks of before, 5 rows a call and 4 in two passes, to measure the difference.)
inline int64_t row_chunk4_avx2(int64_t rows, bool six) {
  return six ? (rows <= 8 ? rows : 6) : std::min<int64_t>(5, rows);
}

void group_rows4_avx2(int64_t rows, const uint8_t* wg, const c10::Half* dg, const uint8_t* sg, int64_t Kp,
                      const int8_t* xq, const int32_t* xsum, const float* sr, const float* bias, const Out& out,
                      int64_t m0, int64_t n0) {
  using Fn = void (*)(const uint8_t*, const c10::Half*, const uint8_t*, int64_t, const int8_t*, const int32_t*,
                      const float*, const float*, const Out&, int64_t, int64_t);
  // one to four rows take all four column sets a pass (each 64-byte weight line loaded once: 3 rows, gamma 2's
  // verification, a layer 1.05x one row's time here on the AVX2 EPYC, 1.36x in two passes; 4 rows 16 sums, a few
  // spilled, still ~9% faster than two passes); five to eight rows two column sets a pass (10 to 16 sums)
  static const Fn fns[9] = {nullptr,        group4<1, 2>, group4<2, 2>, group4<3, 2>, group4<4, 2>,
                            group4<5, 1>, group4<6, 1>, group4<7, 1>, group4<8, 1>};
  const bool six = six_row_chunks.load(std::memory_order_relaxed);
  for (int64_t r = 0; r < rows;) {
    const int64_t mb = row_chunk4_avx2(rows - r, six);
    (!six && mb == 4 ? group4<4, 1> : fns[mb])(wg, dg, sg, Kp, xq + r * Kp, xsum + r * (Kp / 32), sr + r, bias, out,
                                               m0 + r, n0);
    r += mb;
  }
}
