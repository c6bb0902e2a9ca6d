// The row attention's arithmetic, written once for both ISAs: attention_avx512.cpp and attention_avx2.cpp include
// this under their own `#pragma GCC target`, each with its lanes `V`: 16 float32 lanes (`V::F`: one zmm register, or
// two ymm halves) and the operations on them. Every float operation is the same lane for lane and in the same order
// on either, so both give the same bits (tests/test_avx2_kernels.py, tests/test_real_shapes.py).
//
// V provides: F; zero, set1, load, store, load_live / store_live (lanes [0, count) live, the rest 0 / untouched),
// add, sub, mul, max, round_nearest, pow2 (2^n for integral n), keep_finite (e where its score is live and not
// -inf, else 0), reduce_add (GCC's _mm512_reduce_add_ps tree), and KEYS / key_scores (that many keys' scores at once,
// each the bits `dot(q, k) * scale` gives it).
#pragma once
#include "attention_pairs.h"
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// e^x for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln 2 in [-ln2/2, ln2/2], degree-6
// polynomial (relative error about 2e-7); exact order of operations, so the same x always gives the same bits.
template <class V>
__attribute__((always_inline)) inline typename V::F exp_nonpositive(typename V::F x) {
  x = V::max(x, V::set1(-87.0f));
  const typename V::F n = V::round_nearest(V::mul(x, V::set1(1.44269504088896341f)));
  typename V::F r = V::sub(x, V::mul(n, V::set1(0.693359375f)));
  r = V::sub(r, V::mul(n, V::set1(-2.12194440e-4f)));
  typename V::F p = V::set1(1.0f / 720.0f);
  for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = V::add(V::mul(p, r), V::set1(c));
  return V::mul(p, V::pow2(n));
}

// a . b over d floats: 16 lanes of products summed per lane, then reduce_add.
template <class V>
__attribute__((always_inline)) inline float dot(const float* a, const float* b, int64_t d) {
  typename V::F acc = V::zero();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) acc = V::add(acc, V::mul(V::load(a + i), V::load(b + i)));
  if (i < d) acc = V::add(acc, V::mul(V::load_live(a + i, d - i), V::load_live(b + i, d - i)));
  return V::reduce_add(acc);
}

// scores [L] (q . k * scale) -> their exponentials in place (masked keys: 0); returns 1 / their sum, or -1 where
// no key is left to attend to.
template <class V>
__attribute__((always_inline)) inline float softmax_weights(float* scores, int64_t L, const bool* mask_bool,
                                                           const float* mask_add) {
  const float mx = masked_max(scores, L, mask_bool, mask_add);
  if (mx == -std::numeric_limits<float>::infinity()) return -1.0f;
  const typename V::F vmx = V::set1(mx);
  typename V::F sum = V::zero();
  int64_t j = 0;
  for (; j + 16 <= L; j += 16) {
    const typename V::F sc = V::load(scores + j);
    const typename V::F e = V::keep_finite(exp_nonpositive<V>(V::sub(sc, vmx)), sc, 16);
    V::store(scores + j, e);
    sum = V::add(sum, e);
  }
  if (j < L) {  // the last keys: dead lanes read as 0, their exponentials 0, left unwritten
    const typename V::F sc = V::load_live(scores + j, L - j);
    const typename V::F e = V::keep_finite(exp_nonpositive<V>(V::sub(sc, vmx)), sc, L - j);
    V::store_live(scores + j, L - j, e);
    sum = V::add(sum, e);
  }
  return 1.0f / V::reduce_add(sum);
}

// One (batch, query head) for any D: scores [L] as scratch, out [D].
template <class V>
__attribute__((always_inline)) inline void attend_row(const float* q, const float* k, int64_t k_stride, const float* v,
                                                      int64_t v_stride, int64_t L, int64_t D, float scale,
                                                      const bool* mask_bool, const float* mask_add, float* scores,
                                                      float* out) {
  for (int64_t j = 0; j < L; ++j) scores[j] = dot<V>(q, k + j * k_stride, D) * scale;
  for (int64_t i = 0; i < D; ++i) out[i] = 0.0f;
  const float inv = softmax_weights<V>(scores, L, mask_bool, mask_add);
  if (inv < 0.0f) return;  // no key to attend to: zeros
  for (int64_t j = 0; j < L; ++j) {
    const float w = scores[j];
    if (w == 0.0f) continue;
    const float* vj = v + j * v_stride;
    const typename V::F vw = V::set1(w);
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) V::store(out + i, V::add(V::load(out + i), V::mul(vw, V::load(vj + i))));
    for (; i < D; ++i) out[i] = out[i] + w * vj[i];  // (lanes are independent: the same arithmetic)
  }
  for (int64_t i = 0; i < D; ++i) out[i] = out[i] * inv;
}

// attend_row for the pairs that share one key/value head (D a multiple of CH, CH of 16; D_FIXED, where not 0, is D
// known when compiled: the loops over it unrolled), the bits of attend_row for each: its scores, softmax and weighted
// sum are the same operations in the same order. What changes is the order of the work: the keys in blocks (16 for
// the scores, 32 for the values), each block read from memory once and then from L1 by every pair (a pair alone reads
// all its keys and values from L2: the cost of a row, measured), V::KEYS scores made at once, CH of a pair's output
// lanes kept in registers.
template <class V, int CH, int D_FIXED = 0>
__attribute__((always_inline)) inline void attend_pairs(const Pair* pairs, int64_t n, const float* k, int64_t k_stride,
                                                        const float* v, int64_t v_stride, int64_t D_given, float scale) {
  const int64_t D = D_FIXED ? D_FIXED : D_given;
  int64_t lo, hi;
  key_span(pairs, n, lo, hi);
  for (int64_t j0 = lo / 16 * 16; j0 < hi; j0 += 16)
    for (int64_t p = 0; p < n; ++p) {
      const Pair& r = pairs[p];
      int64_t j = std::max(j0, r.lo);
      const int64_t b = std::min(j0 + 16, r.hi);
      for (; j + V::KEYS <= b; j += V::KEYS)
        V::key_scores(r.q, k + j * k_stride, k_stride, D, scale, r.scores + (j - r.lo));
      for (; j < b; ++j) r.scores[j - r.lo] = dot<V>(r.q, k + j * k_stride, D) * scale;
    }
  std::vector<float> inv(n);
  for (int64_t p = 0; p < n; ++p) {
    const Pair& r = pairs[p];
    inv[p] = r.hi > r.lo ? softmax_weights<V>(r.scores, r.hi - r.lo, r.mask_bool, r.mask_add) : -1.0f;
    for (int64_t i = 0; i < D; ++i) r.out[i] = 0.0f;  // (stays so where no key is left)
  }
  for (int64_t j0 = lo / 32 * 32; j0 < hi; j0 += 32)
    for (int64_t p = 0; p < n; ++p) {
      const Pair& r = pairs[p];
      const int64_t a = std::max(j0, r.lo), b = std::min(j0 + 32, r.hi);
      if (inv[p] < 0.0f || a >= b) continue;
      for (int64_t c = 0; c < D; c += CH) {
        typename V::F acc[CH / 16];
        for (int i = 0; i < CH / 16; ++i) acc[i] = V::load(r.out + c + 16 * i);
        for (int64_t j = a; j < b; ++j) {
          const float w = r.scores[j - r.lo];
          if (w == 0.0f) continue;
          const typename V::F vw = V::set1(w);
          for (int i = 0; i < CH / 16; ++i) acc[i] = V::add(acc[i], V::mul(vw, V::load(v + j * v_stride + c + 16 * i)));
        }
        for (int i = 0; i < CH / 16; ++i) V::store(r.out + c + 16 * i, acc[i]);
      }
    }
  for (int64_t p = 0; p < n; ++p)
    if (inv[p] >= 0.0f)
      for (int64_t i = 0; i < D; i += 16)
        V::store(pairs[p].out + i, V::mul(V::load(pairs[p].out + i), V::set1(inv[p])));
}

}  // namespace
