// specdec's row attention (built into the int8 kernel's extension, int8_gemm_avx512.cpp, which
// binds it): each query row of a pass attends over its own keys with the arithmetic fixed here, so a block of rows
// gives each row the bits of a one-token step (what specdec.models.native.row_attention needs).
#include <torch/extension.h>
#include "attention_pairs.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

// The most (row, head) pairs one task of the grouped attention takes (its score lines: PAIRS_PER_TASK x keys).
constexpr int64_t PAIRS_PER_TASK = 32;

// ---- Row attention: one query row over its keys, the arithmetic fixed here (float32) ----
//
// softmax(q . k_j * scale (+ mask_j)) . v over the row's keys, per query head (its key/value head h / (H / H_kv)).
// Every row is computed by the same code whatever else shares the pass, so a block of rows gives each row the
// bits of a one-token step: what specdec.models.native.row_attention needs, without one SDPA call per row and layer.

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace {

// The scores of 16 keys at once (D a multiple of 16), each the bits dot() gives it: key j's 16 per-lane sums made
// in dot()'s order, then _mm512_reduce_add_ps's tree (lane l + lane l + 8, then + 4, + 2, + 1; GCC's avx512fintrin.h)
// taken for the 16 keys together with shuffles: 15 adds where 16 reductions take 64 and wait on each other.
inline __m512 dots16(const float* q, const float* k, int64_t k_stride, int64_t D) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 qi = _mm512_loadu_ps(q + i);
    for (int j = 0; j < 16; ++j)
      acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(qi, _mm512_loadu_ps(k + j * k_stride + i)));
  }
  __m512 t3[8], t6[4], t8[2];
  for (int p = 0; p < 8; ++p)  // lanes 0-7: key 2p's l + (l + 8); 8-15: key 2p + 1's
    t3[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int r = 0; r < 4; ++r)  // quarter c: key 4r + c's l + (l + 4)
    t6[r] = _mm512_add_ps(_mm512_shuffle_f32x4(t3[2 * r], t3[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(t3[2 * r], t3[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int s = 0; s < 2; ++s)  // quarter c: keys 8s + c and 8s + 4 + c, each's l + (l + 2) for l = 0, 1
    t8[s] = _mm512_add_ps(_mm512_shuffle_ps(t6[2 * s], t6[2 * s + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(t6[2 * s], t6[2 * s + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(t8[0], t8[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(t8[0], t8[1], _MM_SHUFFLE(3, 1, 3, 1)));  // lane 4c + e: key 4e+c
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
}

// 16 lanes as one zmm register (attention_rows.h's V).
struct Avx512 {
  using F = __m512;
  static constexpr int KEYS = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static __mmask16 live(int64_t count) {
    return count >= 16 ? static_cast<__mmask16>(0xFFFF)
                       : static_cast<__mmask16>((1u << std::max<int64_t>(0, count)) - 1);
  }
  static F load_live(const float* p, int64_t count) { return _mm512_maskz_loadu_ps(live(count), p); }
  static void store_live(float* p, int64_t count, F x) { _mm512_mask_storeu_ps(p, live(count), x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F round_nearest(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F pow2(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static F keep_finite(F e, F score, int64_t count) {
    return _mm512_maskz_mov_ps(live(count) & _mm512_cmp_ps_mask(score, _mm512_set1_ps(
        -std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ), e);
  }
  static float reduce_add(F x) { return _mm512_reduce_add_ps(x); }
  static void key_scores(const float* q, const float* k, int64_t k_stride, int64_t D, float scale, float* out) {
    _mm512_storeu_ps(out, _mm512_mul_ps(dots16(q, k, k_stride, D), _mm512_set1_ps(scale)));
  }
};

}  // namespace
#include "attention_rows.h"
#pragma GCC pop_options

namespace {

__attribute__((target("avx512f")))
void attend(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t L, int64_t D,
            float scale, const bool* mask_bool, const float* mask_add, float* scores, float* out) {
  attend_row<Avx512>(q, k, k_stride, v, v_stride, L, D, scale, mask_bool, mask_add, scores, out);
}

// The pairs of one key/value head with D = 64, 128 or 256 known when compiled (the loops unrolled): all D lanes of a
// pair's output in registers.
template <int D>
__attribute__((target("avx512f")))
void pairs_of_head(const Pair* pairs, int64_t n, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                   int64_t, float scale) {
  attend_pairs<Avx512, D, D>(pairs, n, k, k_stride, v, v_stride, D, scale);
}

}  // namespace

// The AVX2 path (attention_avx2.cpp): the same bits where the CPU has no AVX-512.
bool use_avx2();
void count_avx2_call();
void attend_avx2(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t L,
                 int64_t D, float scale, const bool* mask_bool, const float* mask_add, float* scores, float* out);
void attend_pairs_avx2(const Pair* pairs, int64_t n, const float* k, int64_t k_stride, const float* v,
                       int64_t v_stride, int64_t D, float scale);

// query [B, H, Q, D]; key/value [B, H_kv, L, D] (last dimension contiguous); row (b, i) attends to keys
// [starts[b, i], ends[b, i]) (int64 [B, Q]); mask None or [B, Q, L] (bool: attend, or float32: added to the
// scores) -> [B, Q, H, D] float32 (the layout transformers' attention functions return).
torch::Tensor row_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                            const torch::Tensor& starts, const torch::Tensor& ends,
                            const c10::optional<torch::Tensor>& mask, double scale) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat32 && key.scalar_type() == torch::kFloat32 &&
              value.scalar_type() == torch::kFloat32, "row_attention takes float32");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "query [B, H, Q, D], key/value [B, H_kv, L, D]");
  const auto q = query.contiguous();
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3), Hkv = key.size(1), L = key.size(2);
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1 && Hkv > 0 && H % Hkv == 0 && key.size(3) == D,
              "key/value: [B, H_kv, L, D] with a contiguous last dimension");
  const auto st = starts.to(torch::kInt64).contiguous(), en = ends.to(torch::kInt64).contiguous();
  TORCH_CHECK(st.numel() == B * Q && en.numel() == B * Q, "starts/ends: [B, Q]");
  c10::optional<torch::Tensor> m;
  if (mask.has_value()) {
    m = mask->contiguous();
    TORCH_CHECK(m->dim() == 3 && m->size(0) == B && m->size(1) == Q && m->size(2) == L, "mask: [B, Q, L]");
    TORCH_CHECK(m->scalar_type() == torch::kBool || m->scalar_type() == torch::kFloat32, "mask: bool or float32");
  }
  auto out = torch::empty({B, Q, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  const int64_t* sp = st.data_ptr<int64_t>();
  const int64_t* ep = en.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / Hkv;
  const bool* mb = (m && m->scalar_type() == torch::kBool) ? m->data_ptr<bool>() : nullptr;
  const float* ma = (m && m->scalar_type() == torch::kFloat32) ? m->data_ptr<float>() : nullptr;
  // row r's keys [lo, hi): its span clipped to the key tensor
  const auto span = [&](int64_t r) {
    return std::make_pair(std::max<int64_t>(0, sp[r]), std::min<int64_t>(L, ep[r]));
  };
  // the pairs (row, head) of each key/value head and batch row together, split in chunks so every thread has work
  const PairsFn pairs_fn = use_avx2() ? (D % 64 == 0 ? attend_pairs_avx2 : nullptr)
                                       : D == 64 ? pairs_of_head<64> : D == 128 ? pairs_of_head<128>
                                       : D == 256 ? pairs_of_head<256> : nullptr;
  if (use_avx2()) count_avx2_call();
  if (B * Q * H == 0) return out;  // nothing to attend (and no chunks to split)
  if (pairs_fn) {
    // chunks of at most PAIRS_PER_TASK pairs (a long masked pass, a prefill, would otherwise give a task Q * group
    // score lines), and at least as many tasks as threads
    const int64_t per = Q * group, units = B * Hkv;
    const int64_t chunks = std::min<int64_t>(per, std::max<int64_t>((per + PAIRS_PER_TASK - 1) / PAIRS_PER_TASK,
                                                                    (at::get_num_threads() + units - 1) / units));
    const int64_t size = (per + chunks - 1) / chunks;
    at::parallel_for(0, units * chunks, 1, [&](int64_t a, int64_t b) {
      std::unique_ptr<float[]> scores(new float[size * L]);  // (each pair writes its line before reading it)
      std::vector<Pair> pairs(size);
      for (int64_t t = a; t < b; ++t) {
        const int64_t bi = t / (Hkv * chunks), g = (t / chunks) % Hkv, c = t % chunks;
        int64_t n = 0;
        for (int64_t idx = c * size; idx < std::min(per, (c + 1) * size); ++idx, ++n) {
          const int64_t i = idx / group, h = g * group + idx % group, row = bi * Q + i;
          const auto [lo, hi] = span(row);
          pairs[n] = {qp + ((bi * H + h) * Q + i) * D, op + (row * H + h) * D, scores.get() + n * L,
                      mb ? mb + row * L + lo : nullptr, ma ? ma + row * L + lo : nullptr, lo, hi};
        }
        pairs_fn(pairs.data(), n, kp + bi * key.stride(0) + g * key.stride(1), key.stride(2),
                 vp + bi * value.stride(0) + g * value.stride(1), value.stride(2), D, static_cast<float>(scale));
      }
    });
    return out;
  }
  const auto attend_row = use_avx2() ? attend_avx2 : attend;
  at::parallel_for(0, B * Q * H, 1, [&](int64_t a, int64_t b) {
    std::vector<float> scores(L);
    for (int64_t t = a; t < b; ++t) {
      const int64_t bi = t / (Q * H), i = (t / H) % Q, h = t % H, g = h / group;
      const int64_t row = bi * Q + i;
      const auto [lo, hi] = span(row);
      float* o = op + (row * H + h) * D;
      if (hi <= lo) {
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        continue;
      }
      attend_row(qp + ((bi * H + h) * Q + i) * D, kp + bi * key.stride(0) + g * key.stride(1) + lo * key.stride(2),
             key.stride(2), vp + bi * value.stride(0) + g * value.stride(1) + lo * value.stride(2), value.stride(2),
             hi - lo, D, static_cast<float>(scale), mb ? mb + row * L + lo : nullptr,
             ma ? ma + row * L + lo : nullptr, scores.data(), o);
    }
  });
  return out;
}

// q [B, L, H, D] and k [B, L, H_kv, D] (contiguous: a projection's output viewed per head), cos/sin [B, L, D] ->
// (q, k) rotated as [B, H, L, D] and [B, H_kv, L, D], contiguous: x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x[D/2:], x[:D/2]), each product and the sum rounded apart (compiled without contraction):
// transformers' apply_rotary_pos_emb element for element, so the same bits, in one call instead of about twelve ops.
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32,
              "rotary: float32 q [B, L, H, D], k [B, L, H_kv, D], cos/sin [B, L, D]");
  const int64_t B = q.size(0), L = q.size(1), D = q.size(3), half = D / 2;
  TORCH_CHECK(D % 2 == 0 && k.size(0) == B && k.size(1) == L && k.size(3) == D && cos.numel() == B * L * D &&
              sin.numel() == B * L * D, "rotary: q, k and cos/sin must agree on [B, L, D]");
  const auto c = cos.contiguous(), s = sin.contiguous();
  std::vector<torch::Tensor> outs;
  for (const auto& x0 : {q, k}) {
    const auto x = x0.contiguous();
    const int64_t H = x.size(2);
    auto out = torch::empty({B, H, L, D}, x.options());
    const float *X = x.data_ptr<float>(), *C = c.data_ptr<float>(), *S = s.data_ptr<float>();
    float* O = out.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        const float* cb = C + (b * L + l) * D;
        const float* sb = S + (b * L + l) * D;
        for (int64_t h = 0; h < H; ++h) {
          const float* xi = X + ((b * L + l) * H + h) * D;
          float* o = O + ((b * H + h) * L + l) * D;
          for (int64_t i = 0; i < half; ++i) o[i] = xi[i] * cb[i] + (-xi[i + half]) * sb[i];
          for (int64_t i = half; i < D; ++i) o[i] = xi[i] * cb[i] + xi[i - half] * sb[i];
        }
      }
    outs.push_back(out);
  }
  return outs;
}
