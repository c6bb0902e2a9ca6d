// The row attention's unit of work (attention_avx512.cpp, attention_avx2.cpp): the query rows and heads that share one
// key/value head, taken together so each block of keys and values is read from memory once.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

// A query row and head: its keys [lo, hi) (positions of the key/value tensors), its mask lines from lo.
struct Pair {
  const float* q;
  float* out;
  float* scores;  // [hi - lo]
  const bool* mask_bool;
  const float* mask_add;
  int64_t lo, hi;
};

// Attention for `n` pairs over the keys k and values v of their key/value head (positions `k_stride` / `v_stride`
// floats apart, head dim D): for each pair the bits of the one-pair code.
using PairsFn = void (*)(const Pair* pairs, int64_t n, const float* k, int64_t k_stride, const float* v,
                         int64_t v_stride, int64_t D, float scale);

// The scores [L] with their mask applied in place (a false entry: -inf; an additive mask: added); their maximum.
inline float masked_max(float* scores, int64_t L, const bool* mask_bool, const float* mask_add) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float mx = neg_inf;
  for (int64_t j = 0; j < L; ++j) {
    float s = scores[j];
    if (mask_bool && !mask_bool[j]) s = neg_inf;
    if (mask_add) s = s + mask_add[j];
    scores[j] = s;
    mx = std::max(mx, s);
  }
  return mx;
}

// The keys any of the pairs reads: [lo, hi) (empty, lo >= hi, where none reads any).
inline void key_span(const Pair* pairs, int64_t n, int64_t& lo, int64_t& hi) {
  lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (int64_t p = 0; p < n; ++p)
    if (pairs[p].hi > pairs[p].lo) lo = std::min(lo, pairs[p].lo), hi = std::max(hi, pairs[p].hi);
}
