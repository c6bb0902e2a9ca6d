// specdec's int8 GEMM for AVX-512 VNNI CPUs: one weight read serves up to 8 activation rows, so a verification
// pass of gamma + 1 tokens streams the weights once, as a one-token step does (flat verification).
//
// Exact and block-invariant: each activation row is quantized on its own (symmetric 8 bits,
// round(x * (1 / max|x|) * 127), the arithmetic of specdec's oneDNN path), the products are accumulated in int32
// (exact), and every output element is scaled on its own: y[m, n] = (float(acc) * sq[n]) * s[m] + bias[n].
// A row's output therefore depends on its own input row only, bit for bit, and equals the oneDNN path's.
//
// Weights: int8 [N, K] packed as [N / 32][K4 / 4][32][4] (N padded to 32, K to 4): for each group of 32 output
// columns, 128 contiguous bytes per 4 input columns, read as two 512-bit registers (16 columns x 4 bytes).
// Activations go in as uint8 (q + 128); colsum128[n] = 128 * sum_k w[n, k] takes the shift back out.
//
// Where the CPU has AMX (and the kernel may use it), the same layout feeds AMX tiles: a group's 16 x 4 input
// columns are a 16-row B tile at a stride of 128 bytes, up to 16 activation rows an A tile, and TDPBUSD adds the
// same int32 products as vpdpbusd. The sums are exact either way, so both paths give the same bits (tested); AMX
// does 16 times the products per instruction, so a verification pass of 8 rows or a prefill stays memory-bound.
#include <torch/extension.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t GROUP = 32;      // output columns per packed group (two zmm registers)
constexpr int64_t MAX_ROWS = 8;    // activation rows per register block (16 accumulators)
constexpr int64_t PREFETCH = 2048; // bytes ahead in the weight stream (measured on the AMX Xeon)

// One output row's 16 columns from n: y[n + j] = (float(acc[j] - colsum128[n + j]) * sq[n + j]) * s + bias[n + j]
// (both GEMM paths end here, so their bits are the same).
__attribute__((target("avx512f,avx512bw")))
inline void store_row(__m512i acc, const int32_t* cs, const float* sq, float s, const float* bias, float* y,
                      int64_t N, int64_t n) {
  const int64_t count = N - n < 16 ? N - n : 16;
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_maskz_loadu_epi32(mask, cs + n))),
                           _mm512_maskz_loadu_ps(mask, sq + n));
  f = _mm512_mul_ps(f, _mm512_set1_ps(s));
  if (bias) f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(mask, bias + n));
  _mm512_mask_storeu_ps(y + n, mask, f);
}

template <int MB>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void group_rows(const int8_t* wg, int64_t KB, const uint8_t* xu, int64_t K4, const int32_t* cs, const float* sq,
                const float* s, const float* bias, float* y, int64_t N, int64_t n0) {
  __m512i acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_si512();
  for (int64_t kb = 0; kb < KB; ++kb) {
    const int8_t* p = wg + kb * 128;
    _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH + 64), _MM_HINT_T0);
    const __m512i w0 = _mm512_loadu_si512(p);
    const __m512i w1 = _mm512_loadu_si512(p + 64);
    for (int m = 0; m < MB; ++m) {
      const __m512i x = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xu + m * K4 + kb * 4));
      acc[m][0] = _mm512_dpbusd_epi32(acc[m][0], x, w0);
      acc[m][1] = _mm512_dpbusd_epi32(acc[m][1], x, w1);
    }
  }
  for (int h = 0; h < 2; ++h) {
    if (n0 + 16 * h >= N) break;
    for (int m = 0; m < MB; ++m) store_row(acc[m][h], cs, sq, s[m], bias, y + m * N, N, n0 + 16 * h);
  }
}

using GroupFn = void (*)(const int8_t*, int64_t, const uint8_t*, int64_t, const int32_t*, const float*, const float*,
                         const float*, float*, int64_t, int64_t);
const GroupFn GROUP_FNS[MAX_ROWS + 1] = {nullptr, group_rows<1>, group_rows<2>, group_rows<3>, group_rows<4>,
                                         group_rows<5>, group_rows<6>, group_rows<7>, group_rows<8>};

// ---- AMX: the same layout through tiles ----

constexpr int64_t AMX_ROWS = 16;  // activation rows per A tile
constexpr int64_t AMX_STEP = 16;  // 4-column lanes per tile step (64 input columns)

// Whether this CPU has AMX-TILE and AMX-INT8 and Linux lets the process use the tile state (asked once).
bool amx_ready() {
  static const bool ready = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ready;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: the accumulators (rows x 16 int32); 2: the activations (rows x 64 bytes); 3, 4: the weights (16 x 64).
__attribute__((target("amx-tile")))
void configure_tiles(int64_t rows) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = static_cast<uint8_t>(t < 3 ? rows : 16);
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // gcc's ldtilecfg names 8 bytes of cfg: keep the other stores
  _tile_loadconfig(&cfg);
}

// One group of 32 output columns for `rows` (<= 16) activation rows; K4 a multiple of 64; tiles configured.
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))
void group_amx(const int8_t* wg, int64_t KB, const uint8_t* xu, int64_t K4, int64_t rows, const int32_t* cs,
               const float* sq, const float* s, const float* bias, float* y, int64_t N, int64_t n0) {
  alignas(64) int32_t acc[2][AMX_ROWS][16];
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t kb = 0; kb < KB; kb += AMX_STEP) {
    const int8_t* p = wg + kb * 128;
    for (int64_t line = 0; line < AMX_STEP * 128; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH + line), _MM_HINT_T0);
    _tile_loadd(2, xu + kb * 4, K4);
    _tile_loadd(3, p, 128);
    _tile_loadd(4, p + 64, 128);
    _tile_dpbusd(0, 2, 3);
    _tile_dpbusd(1, 2, 4);
  }
  _tile_stored(0, acc[0], 64);
  _tile_stored(1, acc[1], 64);
  for (int h = 0; h < 2; ++h) {
    if (n0 + 16 * h >= N) break;
    for (int64_t m = 0; m < rows; ++m)
      store_row(_mm512_load_si512(acc[h][m]), cs, sq, s[m], bias, y + m * N, N, n0 + 16 * h);
  }
}

__attribute__((target("amx-tile")))
void release_tiles() { _tile_release(); }

// x [M, K] -> xu [M, K4] (q + 128; the padding holds 128, i.e. 0) and s [M] (the row scales). Vectorized, with the
// scalar arithmetic's bits: the maximum is exact in any order, and x * inv rounded half to even (roundscale in the
// default rounding mode, as nearbyint and torch.round) is the same product and rounding element by element.
__attribute__((target("avx512f,avx512bw")))
void quantize_rows(const float* x, int64_t M, int64_t K, int64_t K4, bool per_pass, uint8_t* xu, float* s) {
  const float tiny = std::numeric_limits<float>::min();
  float pass_max = 0.0f;
  for (int64_t m = 0; m < M; ++m) {
    __m512 vmx = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 live = K - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - k)) - 1);
      vmx = _mm512_max_ps(vmx, _mm512_abs_ps(_mm512_maskz_loadu_ps(live, x + m * K + k)));
    }
    s[m] = std::max(_mm512_reduce_max_ps(vmx), tiny);
    pass_max = std::max(pass_max, s[m]);
  }
  for (int64_t m = 0; m < M; ++m) {
    if (per_pass) s[m] = pass_max;
    const __m512 inv = _mm512_set1_ps((1.0f / s[m]) * 127.0f);  // as torch computes 127.0 / scale
    const __m512i shift = _mm512_set1_epi32(128);
    for (int64_t k = 0; k < K4; k += 16) {
      const __mmask16 live = K - k >= 16 ? 0xffff : (k < K ? static_cast<__mmask16>((1u << (K - k)) - 1) : 0);
      const __mmask16 out = K4 - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K4 - k)) - 1);
      const __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live, x + m * K + k), inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i u = _mm512_add_epi32(_mm512_cvtps_epi32(q), shift);  // padding: 0 + 128
      _mm512_mask_cvtepi32_storeu_epi8(xu + m * K4 + k, out, u);
    }
  }
}

}  // namespace

// x [M, K] float32 (contiguous), packed [N32 / 32, K4 / 4, 32, 4] int8, colsum128 [N] int32, sq [N] float32 (the
// weight's scale over 127), bias [N] or None -> y [M, N] float32. amx_from: passes of at least this many rows use
// AMX tiles where the CPU has them and K4 is a multiple of 64 (0: never); the bits are the same either way.
torch::Tensor rows(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& colsum128,
                   const torch::Tensor& sq, const c10::optional<torch::Tensor>& bias, int64_t N, bool per_pass,
                   int64_t amx_from) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == GROUP && packed.size(3) == 4, "packed: [N/32, K4/4, 32, 4] int8");
  const int64_t M = x.size(0), K = x.size(1), KB = packed.size(1), K4 = KB * 4, groups = packed.size(0);
  TORCH_CHECK(K <= K4 && K4 - K < 4, "x has ", K, " columns; the packed weight takes ", K4);
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  std::vector<uint8_t> xu(M * K4);
  std::vector<float> s(M);
  quantize_rows(x.data_ptr<float>(), M, K, K4, per_pass, xu.data(), s.data());
  const int8_t* W = packed.data_ptr<int8_t>();
  const int32_t* cs = colsum128.data_ptr<int32_t>();
  const float* sqp = sq.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const bool amx = amx_from > 0 && M >= amx_from && K4 % (4 * AMX_STEP) == 0 && amx_ready();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    int64_t configured = 0;  // the A tile's rows as the tiles are configured on this thread (0: not yet)
    for (int64_t g = g0; g < g1; ++g) {  // a group's weights (KB x 128 bytes) stay in cache across row blocks
      const int64_t step = amx ? AMX_ROWS : MAX_ROWS;
      for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t mb = std::min(step, M - m0);
        if (!amx) {
          GROUP_FNS[mb](W + g * KB * 128, KB, xu.data() + m0 * K4, K4, cs, sqp, s.data() + m0, bp, yp + m0 * N, N,
                        g * GROUP);
          continue;
        }
        if (mb != configured) configure_tiles(configured = mb);
        group_amx(W + g * KB * 128, KB, xu.data() + m0 * K4, K4, mb, cs, sqp, s.data() + m0, bp, yp + m0 * N, N,
                  g * GROUP);
      }
    }
    if (configured) release_tiles();
  });
  return y;
}

bool has_amx() { return amx_ready(); }

// Sibling weights int8 [N_i, K] (rows contiguous), stacked in order -> the packed layout [N32 / 32, K4 / 4, 32, 4]
// (zero padding) and colsum128 [N] (128 * each row's sum), in one pass over the values: what a load waits for
// before its first forward pass (torch's pad, permute and sum read the values three times). One thread: the
// loader packs several layers at once.
std::vector<torch::Tensor> pack(const std::vector<torch::Tensor>& parts) {
  TORCH_CHECK(!parts.empty(), "pack: no weight");
  const int64_t K = parts[0].size(1);
  std::vector<const int8_t*> row;  // [N]
  for (const auto& part : parts) {
    TORCH_CHECK(part.dim() == 2 && part.scalar_type() == torch::kChar && part.size(1) == K && part.stride(1) == 1,
                "pack: int8 [N_i, K] parts with contiguous rows and one K");
    for (int64_t n = 0; n < part.size(0); ++n) row.push_back(part.data_ptr<int8_t>() + n * part.stride(0));
  }
  const int64_t N = static_cast<int64_t>(row.size()), KB = (K + 3) / 4, groups = (N + GROUP - 1) / GROUP;
  auto packed = torch::empty({groups, KB, GROUP, 4}, torch::kChar);  // every byte written below
  auto colsum = torch::empty({N}, torch::kInt);
  int8_t* out = packed.data_ptr<int8_t>();
  int32_t* cs = colsum.data_ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* w = row[n];
    int8_t* o = out + ((n / GROUP) * KB * GROUP + n % GROUP) * 4;  // lane (kb, n) at o + kb * 128
    for (int64_t kb = 0; kb < K / 4; ++kb) std::memcpy(o + kb * GROUP * 4, w + kb * 4, 4);  // 4 bytes a lane
    for (int64_t k = K / 4 * 4; k < KB * 4; ++k) o[(k / 4) * GROUP * 4 + k % 4] = k < K ? w[k] : 0;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += w[k];
    cs[n] = sum * 128;
  }
  for (int64_t n = N; n < groups * GROUP; ++n)  // the last group's padding columns: zero weights
    for (int64_t kb = 0; kb < KB; ++kb) std::memset(out + ((n / GROUP) * KB * GROUP + kb * GROUP + n % GROUP) * 4, 0, 4);
  return {packed, colsum};
}

// ---- Row attention: one query row over its keys, the arithmetic fixed here (float32) ----
//
// softmax(q . k_j * scale (+ mask_j)) . v over the row's keys, per query head (its key/value head h / (H / H_kv)).
// Every row is computed by the same code whatever else shares the pass, so a block of rows gives each row the
// bits of a one-token step: what specdec.models.row_attention needs, without one SDPA call per row and layer.

namespace {

// e^x for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln 2 in [-ln2/2, ln2/2], degree-6
// polynomial (relative error about 2e-7); exact order of operations, so the same x always gives the same bits.
__attribute__((target("avx512f")))
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx512f")))
float dot(const float* a, const float* b, int64_t d) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < d) {
    const __mmask16 m = static_cast<__mmask16>((1u << (d - i)) - 1);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
  return _mm512_reduce_add_ps(acc);
}

// One (batch, query head): scores [L] as scratch, out [D].
__attribute__((target("avx512f")))
void attend(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t L, int64_t D,
            float scale, const bool* mask_bool, const float* mask_add, float* scores, float* out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float mx = neg_inf;
  for (int64_t j = 0; j < L; ++j) {
    float s = dot(q, k + j * k_stride, D) * scale;
    if (mask_bool && !mask_bool[j]) s = neg_inf;
    if (mask_add) s = s + mask_add[j];
    scores[j] = s;
    mx = std::max(mx, s);
  }
  for (int64_t i = 0; i < D; ++i) out[i] = 0.0f;
  if (mx == neg_inf) return;  // no key to attend to: zeros
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= L; j += 16) {
    const __m512 sc = _mm512_loadu_ps(scores + j);
    const __mmask16 live = _mm512_cmp_ps_mask(sc, _mm512_set1_ps(neg_inf), _CMP_NEQ_OQ);  // masked keys: 0
    const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(sc, vmx)));
    _mm512_storeu_ps(scores + j, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (j < L) {
    const __mmask16 m = static_cast<__mmask16>((1u << (L - j)) - 1);
    const __m512 sc = _mm512_maskz_loadu_ps(m, scores + j);
    const __mmask16 live = m & _mm512_cmp_ps_mask(sc, _mm512_set1_ps(neg_inf), _CMP_NEQ_OQ);
    const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(sc, vmx)));
    _mm512_mask_storeu_ps(scores + j, m, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float inv = 1.0f / _mm512_reduce_add_ps(vsum);
  for (int64_t j2 = 0; j2 < L; ++j2) {
    const float w = scores[j2];
    if (w == 0.0f) continue;
    const float* vj = v + j2 * v_stride;
    const __m512 vw = _mm512_set1_ps(w);
    int64_t i = 0;
    for (; i + 16 <= D; i += 16)
      _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_mul_ps(vw, _mm512_loadu_ps(vj + i))));
    for (; i < D; ++i) out[i] = out[i] + w * vj[i];
  }
  for (int64_t i = 0; i < D; ++i) out[i] = out[i] * inv;
}

}  // namespace

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
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1 && H % Hkv == 0 && key.size(3) == D,
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
  at::parallel_for(0, B * Q * H, 1, [&](int64_t a, int64_t b) {
    std::vector<float> scores(L);
    for (int64_t t = a; t < b; ++t) {
      const int64_t bi = t / (Q * H), i = (t / H) % Q, h = t % H, g = h / group;
      const int64_t row = bi * Q + i;
      const int64_t lo = std::max<int64_t>(0, sp[row]), hi = std::min<int64_t>(L, ep[row]);
      float* o = op + (row * H + h) * D;
      if (hi <= lo) {
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        continue;
      }
      const bool* mb = (m && m->scalar_type() == torch::kBool) ? m->data_ptr<bool>() + row * L + lo : nullptr;
      const float* ma = (m && m->scalar_type() == torch::kFloat32) ? m->data_ptr<float>() + row * L + lo : nullptr;
      attend(qp + ((bi * H + h) * Q + i) * D, kp + bi * key.stride(0) + g * key.stride(1) + lo * key.stride(2),
             key.stride(2), vp + bi * value.stride(0) + g * value.stride(1) + lo * value.stride(2), value.stride(2),
             hi - lo, D, static_cast<float>(scale), mb, ma, scores.data(), o);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rows", &rows, "int8 GEMM over row-quantized activations (AVX-512 VNNI or AMX), exact int32 accumulation");
  m.def("pack", &pack, "int8 [N_i, K] parts -> (the GEMM's packed layout, 128 * row sums), one pass");
  m.def("has_amx", &has_amx, "whether the GEMM can use AMX tiles here (the CPU has them and Linux allows them)");
  m.def("row_attention", &row_attention, "attention, each query row over its own keys, float32, fixed arithmetic");
}
