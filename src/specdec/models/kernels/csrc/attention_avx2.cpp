// specdec's row attention for CPUs with AVX2 (and FMA) but no AVX-512: attention_rows.h's code, as
// attention_avx512.cpp runs it, on 16 lanes held as two 8-lane halves (their sums reduced along GCC's
// _mm512_reduce_add_ps: avx2_lanes.h), so the same bits. tests/test_avx2_kernels.py compares the two paths on one
// machine.
#include <torch/extension.h>
#include "attention_pairs.h"
#include "avx2_lanes.h"
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {

// reduce_add16's key sums for 4 keys at once (D a multiple of 16): each key's per-lane sums as dot() makes them,
// then reduce_add16's tree (halves, 128-bit halves, lanes 0 + 2 and 1 + 3, then 0 + 1) taken for the 4 keys together.
inline __m128 dots4(const float* q, const float* k, int64_t k_stride, int64_t D) {
  __m256 lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < D; i += 16) {
    const __m256 ql = _mm256_loadu_ps(q + i), qh = _mm256_loadu_ps(q + i + 8);
    for (int j = 0; j < 4; ++j) {
      lo[j] = _mm256_add_ps(lo[j], _mm256_mul_ps(ql, _mm256_loadu_ps(k + j * k_stride + i)));
      hi[j] = _mm256_add_ps(hi[j], _mm256_mul_ps(qh, _mm256_loadu_ps(k + j * k_stride + i + 8)));
    }
  }
  __m256 t3[4], t6[2];
  for (int j = 0; j < 4; ++j) t3[j] = _mm256_add_ps(hi[j], lo[j]);
  for (int p = 0; p < 2; ++p)  // 128-bit lane 0: key 2p's halves added; lane 1: key 2p + 1's
    t6[p] = _mm256_add_ps(_mm256_permute2f128_ps(t3[2 * p], t3[2 * p + 1], 0x31),
                          _mm256_permute2f128_ps(t3[2 * p], t3[2 * p + 1], 0x20));
  const __m256 t8 = _mm256_add_ps(_mm256_shuffle_ps(t6[0], t6[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(t6[0], t6[1], _MM_SHUFFLE(3, 2, 3, 2)));  // keys 0, 2 | 1, 3
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(t8, t8, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(t8, t8, _MM_SHUFFLE(3, 1, 3, 1)));  // [0, 2, 0, 2 | 1, 3, 1, 3]
  return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
}

// 16 lanes as two ymm halves (attention_rows.h's V): lanes 0-7 and 8-15.
struct Avx2 {
  struct F {
    __m256 lo, hi;
  };
  static constexpr int KEYS = 4;
  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x.lo), _mm256_storeu_ps(p + 8, x.hi); }
  static F load_live(const float* p, int64_t count) {
    return {_mm256_maskload_ps(p, live8(count)), _mm256_maskload_ps(p + 8, live8(count - 8))};
  }
  static void store_live(float* p, int64_t count, F x) {
    _mm256_maskstore_ps(p, live8(count), x.lo), _mm256_maskstore_ps(p + 8, live8(count - 8), x.hi);
  }
  static F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static F sub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static __m256 round8(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F round_nearest(F x) { return {round8(x.lo), round8(x.hi)}; }
  static __m256 pow2_8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static F pow2(F n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
  static __m256 keep8(__m256 e, __m256 score, int64_t count) {
    const __m256 finite = _mm256_and_ps(_mm256_castsi256_ps(live8(count)), _mm256_cmp_ps(score, _mm256_set1_ps(
        -std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ));
    return _mm256_and_ps(finite, e);
  }
  static F keep_finite(F e, F score, int64_t count) {
    return {keep8(e.lo, score.lo, count), keep8(e.hi, score.hi, count - 8)};
  }
  static float reduce_add(F x) { return reduce_add16(x.lo, x.hi); }
  static void key_scores(const float* q, const float* k, int64_t k_stride, int64_t D, float scale, float* out) {
    _mm_storeu_ps(out, _mm_mul_ps(dots4(q, k, k_stride, D), _mm_set1_ps(scale)));
  }
};

}  // namespace
#include "attention_rows.h"
#pragma GCC pop_options

// attention_avx512.cpp's attend_pairs on AVX2 (D a multiple of 64), the same bits: 64 of a pair's output lanes at a
// time in registers.
__attribute__((target("avx2,fma")))
void attend_pairs_avx2(const Pair* pairs, int64_t n, const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride, int64_t D, float scale) {
  attend_pairs<Avx2, 64>(pairs, n, k, k_stride, v, v_stride, D, scale);
}

// attention_avx512.cpp's attend (one query row and head over its L keys) with the same bits.
__attribute__((target("avx2,fma")))
void attend_avx2(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t L,
                 int64_t D, float scale, const bool* mask_bool, const float* mask_add, float* scores, float* out) {
  attend_row<Avx2>(q, k, k_stride, v, v_stride, L, D, scale, mask_bool, mask_add, scores, out);
}
