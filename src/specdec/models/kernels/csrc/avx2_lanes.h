// Helpers of specdec's AVX2 code (gemm_avx2.cpp, attention_avx2.cpp): 16-lane arithmetic of the AVX-512 code as
// two 8-lane halves.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

// _mm512_reduce_add_ps of the 16 lanes (lo = lanes 0-7, hi = 8-15), operation for operation.
__attribute__((target("avx2,fma")))
inline float reduce_add16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

// Lanes [0, count) of 8 live (count may be <= 0 or >= 8).
__attribute__((target("avx2,fma")))
inline __m256i live8(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(8, count)))), index);
}
