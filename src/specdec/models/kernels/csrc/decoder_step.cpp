// specdec's decoder step (built into the int8 kernel's extension, src/specdec/models/kernels/csrc/int8_gemm_avx512.cpp, which binds
// it): every decoder layer of a Qwen2 / Llama-form model for the new tokens of a decoding step or a verification
// pass, in one call from Python.
//
// A step of the 0.5B draft in int4 spent 7 of its 18 ms outside the matrix kernels (AVX-512 EPYC): transformers'
// modules, their Python and a few hundred small ops. Here each layer makes the same calls in the same order with the
// same shapes, so its bits are the Python path's (specdec.models.native.lean_attention with the row attention, tested):
//
//   x = input_layernorm(h)             w * (h * rsqrt(mean(h^2, -1) + eps)): ATen's ops as transformers calls them,
//                                      or with their bits in one pass a row (rms_norm.h, set_norm_lanes)
//   q, k, v = qkv(x)                   the extension's int8 / int4 GEMMs (one fused call or one per projection)
//   q, k = rotary(q, k, cos, sin)      the extension's rotary (transformers' arithmetic)
//   cache[length : length + L] = k, v  the preallocated cache's buffers (specdec.models.cache.kv_cache)
//   h = h + o(row_attention(q, keys, values))
//   x = post_attention_layernorm(h)
//   h = h + down(silu(gate(x)) * up(x))
//
// Where OpenMP's idle threads sleep, transformers' forward runs serial outside the GEMMs and lends the GEMMs the
// caller's threads (specdec.models.kernels.threads): `kernel_threads` > 0 does the same here.
#include <torch/extension.h>
#include "rms_norm.h"
#include <ATen/Parallel.h>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

// Defined in int8_gemm_avx512.cpp, int4_gemm_avx512.cpp and attention_avx512.cpp (the same extension).
std::vector<torch::Tensor> rows(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& colsum128,
                                const torch::Tensor& sq, const c10::optional<torch::Tensor>& bias, int64_t N,
                                bool per_pass, int64_t amx_from, const std::vector<int64_t>& widths);
std::vector<torch::Tensor> rows4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& dmins,
                                 const torch::Tensor& scs, const c10::optional<torch::Tensor>& bias, int64_t N,
                                 int64_t amx_from, const std::vector<int64_t>& widths);
torch::Tensor row_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                            const torch::Tensor& starts, const torch::Tensor& ends,
                            const c10::optional<torch::Tensor>& mask, double scale);
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin);

namespace {

// (kind, tensors, bias, N, widths): kind 8 = int8 (packed, colsum128, sq), 4 = int4 (packed, dmins, scs); the
// output's column parts `widths` (a fused layer's siblings).
using LinearArgs = std::tuple<int64_t, std::vector<torch::Tensor>, c10::optional<torch::Tensor>, int64_t,
                              std::vector<int64_t>>;

struct Linear {
  int64_t kind, N;
  torch::Tensor a, b, c;
  c10::optional<torch::Tensor> bias;
  std::vector<int64_t> widths;

  explicit Linear(const LinearArgs& args)
      : kind(std::get<0>(args)), N(std::get<3>(args)), bias(std::get<2>(args)), widths(std::get<4>(args)) {
    const auto& t = std::get<1>(args);
    TORCH_CHECK((kind == 4 || kind == 8) && t.size() == 3, "decoder step: a linear layer is (4 or 8, [3 tensors], ...)");
    a = t[0], b = t[1], c = t[2];
  }
};

struct Layer {
  torch::Tensor norm_in, norm_post;
  double eps_in, eps_post;
  std::vector<Linear> qkv, gate_up;
  std::vector<Linear> o, down;  // one each
};

// The threads of the kernel calls where the rest runs serial (0: the caller's threads throughout).
class KernelThreads {
 public:
  explicit KernelThreads(int64_t threads) : threads_(threads) {
    if (threads_ > 0) at::set_num_threads(static_cast<int>(threads_));
  }
  ~KernelThreads() {
    if (threads_ > 0) at::set_num_threads(1);
  }

 private:
  int64_t threads_;
};

std::vector<torch::Tensor> linear_parts(const std::vector<Linear>& linears, const torch::Tensor& x2, int64_t amx_from,
                                        int64_t threads) {
  KernelThreads kernel(threads);
  std::vector<torch::Tensor> parts;
  for (const auto& l : linears) {
    auto ys = l.kind == 4 ? rows4(x2, l.a, l.b, l.c, l.bias, l.N, amx_from, l.widths)
                          : rows(x2, l.a, l.b, l.c, l.bias, l.N, false, amx_from, l.widths);
    parts.insert(parts.end(), ys.begin(), ys.end());
  }
  return parts;
}

// transformers' RMSNorm of a float32 input, op for op: weight * (h * rsqrt(mean(h.pow(2), -1, keepdim) + eps)).
torch::Tensor rms_norm(const torch::Tensor& h, const torch::Tensor& weight, double eps) {
  return at::mul(weight, at::mul(h, at::rsqrt(at::add(at::mean(at::pow(h, 2), {-1}, true), eps))));
}

}  // namespace

class DecoderStep {
 public:
  DecoderStep(int64_t head_dim, double scaling) : head_dim_(head_dim), scaling_(scaling) {}

  void add_layer(const torch::Tensor& norm_in, double eps_in, const torch::Tensor& norm_post, double eps_post,
                 const std::vector<LinearArgs>& qkv, const LinearArgs& o, const std::vector<LinearArgs>& gate_up,
                 const LinearArgs& down) {
    Layer layer{norm_in, norm_post, eps_in, eps_post, {}, {}, {Linear(o)}, {Linear(down)}};
    for (const auto& l : qkv) layer.qkv.emplace_back(l);
    for (const auto& l : gate_up) layer.gate_up.emplace_back(l);
    layers_.push_back(std::move(layer));
  }

  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }

  // The RMSNorms (and the residual adds before them) in one pass a row with ATen's bits for sums in vectors of
  // `lanes` (8 or 16: rms_norm.h), where the caller found them equal to ATen's here; 0: ATen's ops.
  void set_norm_lanes(int64_t lanes) {
    TORCH_CHECK(lanes == 0 || lanes == 8 || lanes == 16, "decoder step: norm lanes 0, 8 or 16, not ", lanes);
    norm_lanes_ = static_cast<int>(lanes);
  }
  int64_t norm_lanes() const { return norm_lanes_; }

  // h [B, L, H] float32 (the embedded new tokens), cos / sin [B, L, D], keys / values per layer: buffers
  // [B, H_kv, capacity, D] holding `length` positions (capacity >= length + L) -> the last layer's output [B, L, H];
  // each layer's new keys and values written at [length, length + L).
  torch::Tensor forward(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin,
                        const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                        int64_t length, int64_t amx_from, int64_t kernel_threads) {
    TORCH_CHECK(h.dim() == 3 && h.scalar_type() == torch::kFloat32, "decoder step: h must be float32 [B, L, H]");
    TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(),
                "decoder step: one key and one value buffer per layer");
    const int64_t B = h.size(0), L = h.size(1), H = h.size(2), end = length + L;
    for (size_t i = 0; i < layers_.size(); ++i)
      TORCH_CHECK(keys[i].size(2) >= end && values[i].size(2) >= end, "decoder step: the cache buffers hold ",
                  keys[i].size(2), " positions; ", end, " needed");
    // each row's keys: positions 0 .. its own (row_attention's spans of a pass without a mask)
    const auto ends = at::arange(end - L + 1, end + 1, torch::kLong).expand({B, L}).contiguous();  // [B, L]
    const auto starts = at::zeros_like(ends);
    return run(std::move(h), cos, sin, B, L, [&](size_t i, const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v) {
      keys[i].narrow(2, length, L).copy_(k);
      values[i].narrow(2, length, L).copy_(v);
      return row_attention(q, keys[i].narrow(2, 0, end), values[i].narrow(2, 0, end), starts, ends, c10::nullopt,
                           scaling_);  // [B, L, H_q, D]
    }, amx_from, kernel_threads);
  }

  // The sequences of a batch packed into one pass (specdec.models.sessions.batch_session), no padding: h [1, M, H]
  // holds, in order, counts[b] new tokens of sequence b (b < B, counts[b] may be 0) at its positions lengths[b] ..
  // lengths[b] + counts[b] - 1; cos / sin [1, M, D] theirs; keys / values per layer: buffers [R >= B, H_kv,
  // capacity, D], row b sequence b's. Each sequence's new keys and values are written in its row at its positions,
  // and each of its tokens attends over the keys of its own prefix: what a pass of that sequence alone computes,
  // every op row by row, so the same bits. -> the last layer's output [1, M, H].
  torch::Tensor forward_packed(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin,
                               const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                               const std::vector<int64_t>& lengths, const std::vector<int64_t>& counts,
                               int64_t amx_from, int64_t kernel_threads) {
    TORCH_CHECK(h.dim() == 3 && h.size(0) == 1 && h.scalar_type() == torch::kFloat32,
                "decoder step: h must be float32 [1, M, H]");
    TORCH_CHECK(keys.size() == layers_.size() && values.size() == layers_.size(),
                "decoder step: one key and one value buffer per layer");
    TORCH_CHECK(lengths.size() == counts.size(), "decoder step: ", lengths.size(), " lengths for ", counts.size(),
                " counts");
    const int64_t B = static_cast<int64_t>(counts.size()), M = h.size(1);
    struct Segment {
      int64_t row, offset, count, at;
    };
    std::vector<Segment> segments;
    int64_t offset = 0, W = 0, end = 0;  // W: the widest sequence; the keys a pass reads: [0, end)
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(counts[b] >= 0 && lengths[b] >= 0, "decoder step: negative count or length for row ", b);
      if (!counts[b]) continue;
      segments.push_back({b, offset, counts[b], lengths[b]});
      offset += counts[b];
      W = std::max(W, counts[b]);
      end = std::max(end, lengths[b] + counts[b]);
    }
    TORCH_CHECK(offset == M, "decoder step: the counts add up to ", offset, " tokens; h holds ", M);
    for (size_t i = 0; i < layers_.size(); ++i)
      TORCH_CHECK(keys[i].size(0) >= B && values[i].size(0) >= B && keys[i].size(2) >= end && values[i].size(2) >= end,
                  "decoder step: the cache buffers hold ", keys[i].size(0), " rows of ", keys[i].size(2),
                  " positions; ", B, " rows of ", end, " needed");
    // The attention runs padded, in one call as transformers' padded pass does: each token's query at (row b, its
    // place i) of [B, W], attending over keys [0, lengths[b] + i + 1) of row b; the padding's spans are empty.
    auto place = torch::empty({M}, torch::kLong);  // packed token -> b * W + i
    auto ends = torch::zeros({B, W}, torch::kLong);
    auto* pp = place.data_ptr<int64_t>();
    auto* ep = ends.data_ptr<int64_t>();
    for (const auto& s : segments)
      for (int64_t i = 0; i < s.count; ++i) {
        pp[s.offset + i] = s.row * W + i;
        ep[s.row * W + i] = s.at + i + 1;
      }
    const auto starts = torch::zeros_like(ends);
    return run(std::move(h), cos, sin, 1, M, [&](size_t i, const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v) {
      const auto key_rows = keys[i].narrow(0, 0, B), value_rows = values[i].narrow(0, 0, B);  // [B, H_kv, C, D]
      for (const auto& s : segments) {  // each sequence's new keys and values in its own row, at its positions
        key_rows.select(0, s.row).narrow(1, s.at, s.count).copy_(k.select(0, 0).narrow(1, s.offset, s.count));
        value_rows.select(0, s.row).narrow(1, s.at, s.count).copy_(v.select(0, 0).narrow(1, s.offset, s.count));
      }
      const int64_t heads = q.size(1), dim = q.size(3);
      auto padded = torch::zeros({B * W, heads, dim}, q.options());  // [B W, H_q, D]
      padded.index_copy_(0, place, q.select(0, 0).transpose(0, 1));  // q [1, H_q, M, D]
      auto out = row_attention(padded.view({B, W, heads, dim}).transpose(1, 2), key_rows.narrow(2, 0, end),
                               value_rows.narrow(2, 0, end), starts, ends, c10::nullopt, scaling_);  // [B, W, H_q, D]
      return out.view({B * W, heads, dim}).index_select(0, place).view({1, M, heads, dim});  // [1, M, H_q, D]
    }, amx_from, kernel_threads);
  }

 private:
  // Every layer over h [B, L, H]; `attend(layer, q [B, H_q, L, D], k [B, H_kv, L, D], v [B, H_kv, L, D])` writes
  // the layer's new keys and values and returns the attention's output [B, L, H_q, D].
  template <typename Attend>
  torch::Tensor run(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin, int64_t B, int64_t L,
                    const Attend& attend, int64_t amx_from, int64_t kernel_threads) {
    const int64_t H = h.size(2);
    const int lanes = norm_lanes_;
    if (lanes) h = h.contiguous().clone();  // (added to in place below)
    torch::Tensor pending;  // the last sublayer's output, not yet added to h (fused into the next norm)
    // x = norm(h + pending) [M, H], h updated
    auto norm = [&](const torch::Tensor& weight, double eps) {
      if (!lanes) {
        if (pending.defined()) h = at::add(h, pending.view({B, L, H}));
        pending = torch::Tensor();
        return rms_norm(h, weight, eps).reshape({B * L, H});
      }
      auto x = rms::residual_norm(h, pending.defined() ? &pending : nullptr, weight, eps, lanes);
      pending = torch::Tensor();
      return x.view({B * L, H});
    };
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      auto x = norm(layer.norm_in, layer.eps_in);  // [M, H]
      auto qkv = linear_parts(layer.qkv, x, amx_from, kernel_threads);  // q [M, H_q * D], k, v [M, H_kv * D]
      TORCH_CHECK(qkv.size() == 3, "decoder step: the attention's projections give ", qkv.size(), " parts, not 3");
      auto qk = rotary(qkv[0].view({B, L, -1, head_dim_}), qkv[1].view({B, L, -1, head_dim_}), cos,
                       sin);  // q [B, H_q, L, D], k [B, H_kv, L, D]
      auto v = qkv[2].view({B, L, -1, head_dim_}).transpose(1, 2);  // [B, H_kv, L, D]
      auto attended = attend(i, qk[0], qk[1], v);  // [B, L, H_q, D]
      pending = linear_parts(layer.o, attended.reshape({B, L, -1}).contiguous().view({B * L, -1}), amx_from,
                             kernel_threads)[0];  // [M, H]
      x = norm(layer.norm_post, layer.eps_post);
      auto gu = linear_parts(layer.gate_up, x, amx_from, kernel_threads);  // gate, up [M, I]
      TORCH_CHECK(gu.size() == 2, "decoder step: the MLP's gate and up give ", gu.size(), " parts, not 2");
      auto act = at::mul(at::silu(gu[0]), gu[1]);
      pending = linear_parts(layer.down, act, amx_from, kernel_threads)[0];  // [M, H]
    }
    if (pending.defined()) {
      if (lanes) h.add_(pending.view({B, L, H}));
      else h = at::add(h, pending.view({B, L, H}));
    }
    return h;
  }

  int64_t head_dim_;
  double scaling_;
  int norm_lanes_ = 0;
  std::vector<Layer> layers_;
};

// x = weight * (h * rsqrt(mean(h^2, -1) + eps)) for float32 h [.., H], summing as ATen does in vectors of `lanes`
// (rms_norm.h): what the decoder step's norms compute; the Python side compares it with ATen's ops.
torch::Tensor rms_norm_lanes(const torch::Tensor& h, const torch::Tensor& weight, double eps, int64_t lanes) {
  TORCH_CHECK(lanes == 8 || lanes == 16, "rms_norm_lanes: lanes 8 or 16, not ", lanes);
  auto copy = h.to(torch::kFloat32).contiguous().clone();
  return rms::residual_norm(copy, nullptr, weight.to(torch::kFloat32).contiguous(), eps, static_cast<int>(lanes));
}

void bind_decoder_step(pybind11::module& m) {
  m.def("rms_norm_lanes", &rms_norm_lanes, "transformers' RMSNorm with ATen's bits for sums in vectors of `lanes`");
  pybind11::class_<DecoderStep>(m, "DecoderStep", pybind11::dynamic_attr())  // (Python notes its layers on it)
      .def(pybind11::init<int64_t, double>())
      .def("add_layer", &DecoderStep::add_layer)
      .def("layers", &DecoderStep::layers)
      .def("set_norm_lanes", &DecoderStep::set_norm_lanes)
      .def("norm_lanes", &DecoderStep::norm_lanes)
      .def("forward", &DecoderStep::forward, pybind11::call_guard<pybind11::gil_scoped_release>())  // (no Python inside)
      .def("forward_packed", &DecoderStep::forward_packed, pybind11::call_guard<pybind11::gil_scoped_release>());
}
