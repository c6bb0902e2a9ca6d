// The output of specdec's GEMMs (int8_gemm_avx512.cpp, int4_gemm_avx512.cpp) as one tensor per part of its columns.
#pragma once
#include <torch/extension.h>
#include <cstdint>
#include <vector>

// Where a part of the output goes: [M, end - start] float32, row m's column n (start <= n < end) at
// y + m * ld + n - start. The siblings of a fused layer get one part each, so none is sliced and copied after.
struct Out {
  float* y;
  int64_t ld, start, end;
};

// [M, w_i] float32 tensors for the parts `widths` of N columns (empty: one part), and in `outs` the part of each
// group of `group` columns; each part but the last must start at a multiple of `group`, and the groups must be
// `groups` in all (the packed weight's). Checked first: N fits the packed weight's groups, a bias holds N floats.
inline std::vector<torch::Tensor> output_parts(const torch::Tensor& x, int64_t M, int64_t N, int64_t groups,
                                               const std::vector<int64_t>& widths, int64_t group, const char* who,
                                               const c10::optional<torch::Tensor>& bias, std::vector<Out>& outs) {
  TORCH_CHECK(N >= 0 && N <= groups * group, who, ": N = ", N, " output columns; the packed weight holds ", groups * group);
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() &&
              bias->numel() >= N), "bias: contiguous float32 [N] (N = ", N, ")");
  std::vector<torch::Tensor> ys;
  int64_t start = 0;
  for (size_t i = 0; i < (widths.empty() ? 1 : widths.size()); ++i) {
    const int64_t width = widths.empty() ? N : widths[i];
    TORCH_CHECK(width > 0 && start % group == 0, who, ": parts must start at multiples of ", group, " columns");
    ys.push_back(torch::empty({M, width}, x.options()));
    for (int64_t n = start; n < start + width; n += group) outs.push_back({ys.back().data_ptr<float>(), width, start,
                                                                            start + width});
    start += width;
  }
  TORCH_CHECK(start == N && static_cast<int64_t>(outs.size()) == groups, who, ": the parts' widths must sum to ", N);
  return ys;
}
