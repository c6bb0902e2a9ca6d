// transformers' RMSNorm of float32 rows, weight * (h * rsqrt(mean(h^2, -1) + eps)), with the bits of its ATen ops
// (pow, mean, add, rsqrt, mul, mul) in one pass over each row, and the residual add before it fused in: the decoder
// step (decoder_step.cpp) made a dozen ATen calls a layer for these (~25 us each on a one-token step's 896 values,
// ~1 ms of the 0.5B draft's ~20 ms step on the AVX2 EPYC).
//
// Elementwise, each ATen op rounds once (x * x, s / H, s + float(eps), 1 / sqrt(s), h * r, w * t), so only the sum
// needs care: ATen sums a contiguous float row (SumKernel.cpp, cascade_sum's vectorized inner sum) in vectors of its
// CPU capability's width V (8 lanes for AVX2, 16 for AVX-512), four of them interleaved, through a four-level
// cascade (multi_row_sum); then the row's tail past the last whole vector one by one, then the V lanes in order.
// rms_sum_squares reproduces that order lane by lane for a given V. The decoder step runs it only where the Python
// side found its bits equal to ATen's on this machine (specdec.models.native.decoder_step.norm_lanes); elsewhere it
// keeps the ATen ops.
#pragma once
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace rms {

constexpr int MAX_LANES = 16;

// ceil(log2(x)), 1 for x <= 2 (ATen's utils::CeilLog2)
inline int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

// sum of x[i]^2 over n floats in ATen's order for vectors of V lanes (see above).
template <int V>
float sum_squares(const float* x, int64_t n) {
  const int64_t vectors = n / V, size = vectors / 4;  // row_sum: vectors as a (-1, 4) array, size its rows
  constexpr int levels = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(size) / levels), step = int64_t(1) << power,
                mask = step - 1;
  float acc[levels][4][V] = {};
  auto add_row = [&](int64_t i) {  // row i of the (-1, 4) array into level 0
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < V; ++l) {
        const float v = x[(i * 4 + k) * V + l];
        acc[0][k][l] += v * v;
      }
  };
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int j = 1; j < levels; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < V; ++l) acc[j][k][l] += acc[j - 1][k][l], acc[j - 1][k][l] = 0.0f;
      if (i & (mask << (j * power))) break;
    }
  }
  for (; i < size; ++i) add_row(i);
  for (int j = 1; j < levels; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < V; ++l) acc[0][k][l] += acc[j][k][l];
  float part[V];  // row_sum's partial_sums[0]: the vectors past the last whole row, then the other three
  for (int l = 0; l < V; ++l) part[l] = acc[0][0][l];
  for (int64_t v = size * 4; v < vectors; ++v)
    for (int l = 0; l < V; ++l) {
      const float e = x[v * V + l];
      part[l] += e * e;
    }
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < V; ++l) part[l] += acc[0][k][l];
  float total = 0.0f;  // vectorized_inner_sum: the scalar tail first, then the lanes
  for (int64_t k = vectors * V; k < n; ++k) total += x[k] * x[k];
  for (int l = 0; l < V; ++l) total += part[l];
  return total;
}

inline float sum_squares(const float* x, int64_t n, int lanes) {
  if (n < lanes) {  // (ATen's scalar inner sum: row_sum over single values, too few for its cascade)
    const int64_t size = n / 4;
    float part[4] = {};
    for (int64_t i = 0; i < size; ++i)
      for (int k = 0; k < 4; ++k) part[k] += x[i * 4 + k] * x[i * 4 + k];
    for (int64_t i = size * 4; i < n; ++i) part[0] += x[i] * x[i];
    for (int k = 1; k < 4; ++k) part[0] += part[k];
    return part[0];
  }
  return lanes == 16 ? sum_squares<16>(x, n) : sum_squares<8>(x, n);
}

// h [rows, H] float32 contiguous; if delta is given, h += delta first (in place, as at::add rounds it); -> x [rows,
// H] = weight * (h * rsqrt(mean(h^2) + eps)) with ATen's bits for V = lanes (8 or 16).
inline torch::Tensor residual_norm(torch::Tensor& h, const torch::Tensor* delta, const torch::Tensor& weight, double eps,
                                   int lanes) {
  const int64_t H = h.size(-1), rows = h.numel() / H;
  auto x = torch::empty_like(h);
  float* hp = h.data_ptr<float>();
  float* xp = x.data_ptr<float>();
  const torch::Tensor d = delta ? delta->contiguous() : torch::Tensor();
  TORCH_CHECK(h.is_contiguous() && h.scalar_type() == torch::kFloat32 && weight.is_contiguous() &&
              weight.numel() == H && (!delta || d.numel() == h.numel()), "rms norm: h [.., H] contiguous float32, "
              "weight [H], delta like h");
  const float* dp = delta ? d.data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  const float e = static_cast<float>(eps), count = static_cast<float>(H);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = hp + r * H;
    if (dp)
      for (int64_t i = 0; i < H; ++i) row[i] = row[i] + dp[r * H + i];
    const float mean = sum_squares(row, H, lanes) / count;
    const float scale = 1.0f / std::sqrt(mean + e);
    for (int64_t i = 0; i < H; ++i) xp[r * H + i] = wp[i] * (row[i] * scale);
  }
  return x;
}

}  // namespace rms
