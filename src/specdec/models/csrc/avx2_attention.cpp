// specdec's row attention for CPUs with AVX2 (and FMA) but no AVX-512: row_attention.cpp's attend and attend_pairs
// with the same bits (every float operation the AVX-512 code's, lane for lane, in the same order; its 16-lane sums
// as two 8-lane halves reduced along GCC's _mm512_reduce_add_ps: avx2_lanes.h). tests/test_avx2_kernels.py compares
// the two paths on one machine.
#include <torch/extension.h>
#include "attention_pairs.h"
#include "avx2_lanes.h"
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// exp_nonpositive of row_attention.cpp on 8 lanes, operation for operation.
__attribute__((target("avx2,fma")))
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// row_attention.cpp's dot: 16 lanes of products summed per lane, then _mm512_reduce_add_ps.
__attribute__((target("avx2,fma")))
float dot16(const float* a, const float* b, int64_t d) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __m256i l0 = live8(d - i), l1 = live8(d - i - 8);
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_maskload_ps(a + i, l0), _mm256_maskload_ps(b + i, l0)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_maskload_ps(a + i + 8, l1), _mm256_maskload_ps(b + i + 8, l1)));
  }
  return reduce_add16(lo, hi);
}

// The scores' exponentials for lanes [j, j + 8) of L (count live), written back; their sum added to acc.
__attribute__((target("avx2,fma")))
inline __m256 exp_scores(float* scores, int64_t count, __m256 vmx, __m256 acc) {
  const __m256i live = live8(count);
  const __m256 sc = _mm256_maskload_ps(scores, live);
  const __m256 finite = _mm256_and_ps(_mm256_castsi256_ps(live), _mm256_cmp_ps(sc, _mm256_set1_ps(
      -std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ));  // masked keys: 0
  const __m256 e = _mm256_and_ps(finite, exp8(_mm256_sub_ps(sc, vmx)));
  _mm256_maskstore_ps(scores, live, e);
  return _mm256_add_ps(acc, e);
}

// softmax_weights of row_attention.cpp: scores [L] -> exponentials in place (masked keys 0), 1 / their sum or -1.
__attribute__((target("avx2,fma")))
float softmax_weights_avx2(float* scores, int64_t L, const bool* mask_bool, const float* mask_add) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float mx = masked_max(scores, L, mask_bool, mask_add);
  if (mx == neg_inf) return -1.0f;
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t j = 0; j < L; j += 16)  // (dead lanes add zeros, as the AVX-512 code's masked lanes do)
    lo = exp_scores(scores + j, L - j, vmx, lo), hi = exp_scores(scores + j + 8, L - j - 8, vmx, hi);
  return 1.0f / reduce_add16(lo, hi);
}

// dot16 for 4 keys at once (D a multiple of 16): each key's per-lane sums as dot16 makes them, then reduce_add16's
// tree (halves, 128-bit halves, lanes 0 + 2 and 1 + 3, then 0 + 1) taken for the 4 keys together.
__attribute__((target("avx2,fma")))
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

}  // namespace

// attend_pairs of row_attention.cpp on AVX2 (D a multiple of 64), the same bits: the keys in blocks of 16 for the
// scores (4 summed at once), blocks of 32 for the values, 64 of a pair's output lanes at a time in registers.
__attribute__((target("avx2,fma")))
void attend_pairs_avx2(const Pair* pairs, int64_t n, const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride, int64_t D, float scale) {
  int64_t lo, hi;
  key_span(pairs, n, lo, hi);
  for (int64_t j0 = lo / 16 * 16; j0 < hi; j0 += 16)
    for (int64_t p = 0; p < n; ++p) {
      const Pair& r = pairs[p];
      int64_t j = std::max(j0, r.lo);
      const int64_t b = std::min(j0 + 16, r.hi);
      for (; j + 4 <= b; j += 4)
        _mm_storeu_ps(r.scores + (j - r.lo), _mm_mul_ps(dots4(r.q, k + j * k_stride, k_stride, D), _mm_set1_ps(scale)));
      for (; j < b; ++j) r.scores[j - r.lo] = dot16(r.q, k + j * k_stride, D) * scale;
    }
  std::vector<float> inv(n);
  for (int64_t p = 0; p < n; ++p) {
    const Pair& r = pairs[p];
    inv[p] = r.hi > r.lo ? softmax_weights_avx2(r.scores, r.hi - r.lo, r.mask_bool, r.mask_add) : -1.0f;
    for (int64_t i = 0; i < D; ++i) r.out[i] = 0.0f;
  }
  for (int64_t j0 = lo / 32 * 32; j0 < hi; j0 += 32)
    for (int64_t p = 0; p < n; ++p) {
      const Pair& r = pairs[p];
      const int64_t a = std::max(j0, r.lo), b = std::min(j0 + 32, r.hi);
      if (inv[p] < 0.0f || a >= b) continue;
      for (int64_t c = 0; c < D; c += 64) {
        __m256 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(r.out + c + 8 * i);
        for (int64_t j = a; j < b; ++j) {
          const float w = r.scores[j - r.lo];
          if (w == 0.0f) continue;
          const __m256 vw = _mm256_set1_ps(w);
          for (int i = 0; i < 8; ++i)
            acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(vw, _mm256_loadu_ps(v + j * v_stride + c + 8 * i)));
        }
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(r.out + c + 8 * i, acc[i]);
      }
    }
  for (int64_t p = 0; p < n; ++p)
    if (inv[p] >= 0.0f)
      for (int64_t i = 0; i < D; i += 8)
        _mm256_storeu_ps(pairs[p].out + i, _mm256_mul_ps(_mm256_loadu_ps(pairs[p].out + i), _mm256_set1_ps(inv[p])));
}

// attend of row_attention.cpp (one query row and head over its L keys) with the same bits.
__attribute__((target("avx2,fma")))
void attend_avx2(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t L,
                 int64_t D, float scale, const bool* mask_bool, const float* mask_add, float* scores, float* out) {
  for (int64_t j = 0; j < L; ++j) scores[j] = dot16(q, k + j * k_stride, D) * scale;
  for (int64_t i = 0; i < D; ++i) out[i] = 0.0f;
  const float inv = softmax_weights_avx2(scores, L, mask_bool, mask_add);
  if (inv < 0.0f) return;
  for (int64_t j = 0; j < L; ++j) {
    const float w = scores[j];
    if (w == 0.0f) continue;
    const float* vj = v + j * v_stride;
    const __m256 vw = _mm256_set1_ps(w);
    int64_t i = 0;
    for (; i + 8 <= D; i += 8)  // (lanes are independent: 8 at a time is the 16-lane code's arithmetic)
      _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_mul_ps(vw, _mm256_loadu_ps(vj + i))));
    for (; i < D; ++i) out[i] = out[i] + w * vj[i];
  }
  for (int64_t i = 0; i < D; ++i) out[i] = out[i] * inv;
}
