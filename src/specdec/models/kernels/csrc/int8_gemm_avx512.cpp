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
#include "output_parts.h"
#include "amx_tiles.h"
#include "work_items.h"
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t GROUP = 32;      // output columns per packed group (two zmm registers)
constexpr int64_t MAX_ROWS = 8;    // activation rows per register block (16 accumulators)
constexpr int64_t PREFETCH = 2048; // bytes ahead in the weight stream (measured on the AMX Xeon)

// Up to 16 columns of one output row, n0 on: y[n] = (float(acc[j] - colsum128[n]) * sq[n]) * s + bias[n], written
// to the part that holds column n0 (both GEMM paths end here, so their bits are the same).
__attribute__((target("avx512f,avx512bw")))
inline void store_row(__m512i acc, const int32_t* cs, const float* sq, float s, const float* bias, const Out& out,
                      int64_t m, int64_t n0) {
  const int64_t count = out.end - n0 < 16 ? out.end - n0 : 16;
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_maskz_loadu_epi32(mask, cs + n0))),
                           _mm512_maskz_loadu_ps(mask, sq + n0));
  f = _mm512_mul_ps(f, _mm512_set1_ps(s));
  if (bias) f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(mask, bias + n0));
  _mm512_mask_storeu_ps(out.y + m * out.ld + (n0 - out.start), mask, f);
}

template <int MB>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void group_rows(const int8_t* wg, int64_t KB, const uint8_t* xu, int64_t K4, const int32_t* cs, const float* sq,
                const float* s, const float* bias, const Out& out, int64_t m0, int64_t n0) {
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
    if (n0 + 16 * h >= out.end) break;
    for (int m = 0; m < MB; ++m) store_row(acc[m][h], cs, sq, s[m], bias, out, m0 + m, n0 + 16 * h);
  }
}

using GroupFn = void (*)(const int8_t*, int64_t, const uint8_t*, int64_t, const int32_t*, const float*, const float*,
                         const float*, const Out&, int64_t, int64_t);
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

// Tiles 0, 1: the accumulators (rows x 16 int32); 2: the activations (rows x 64 bytes); 3, 4: the weights (16 x 64).
void configure_tiles(int64_t rows) {
  const uint8_t r = static_cast<uint8_t>(rows), tile_rows[5] = {r, r, r, 16, 16};
  const uint16_t colsb[5] = {64, 64, 64, 64, 64};
  configure(tile_rows, colsb, 5);
}

// One group of 32 output columns for `rows` (<= 16) activation rows; K4 a multiple of 64; tiles configured.
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))
void group_amx(const int8_t* wg, int64_t KB, const uint8_t* xu, int64_t K4, int64_t rows, const int32_t* cs,
               const float* sq, const float* s, const float* bias, const Out& out, int64_t m0, int64_t n0) {
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
    if (n0 + 16 * h >= out.end) break;
    for (int64_t m = 0; m < rows; ++m)
      store_row(_mm512_load_si512(acc[h][m]), cs, sq, s[m], bias, out, m0 + m, n0 + 16 * h);
  }
}

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

// The AVX2 path (gemm_avx2.cpp): the same bits where the CPU has no AVX-512 VNNI.
bool use_avx2();
void quantize_rows_avx2(const float* x, int64_t M, int64_t K, int64_t K4, bool per_pass, uint8_t* xu, float* s);
void group_rows_avx2(int64_t rows, const int8_t* wg, int64_t KB, const int16_t* x16, int64_t K4, const int32_t* cs,
                     const float* sq, const float* s, const float* bias, const Out& out, int64_t m0, int64_t n0);

// x [M, K] float32 (contiguous), packed [N32 / 32, K4 / 4, 32, 4] int8, colsum128 [N] int32, sq [N] float32 (the
// weight's scale over 127), bias [N] or None -> y [M, N] float32, as one tensor per part: `widths` splits the N
// columns (a fused layer's siblings; each part but the last a multiple of 32 wide; empty: one part). amx_from:
// passes of at least this many rows use AMX tiles where the CPU has them and K4 is a multiple of 64 (0: never);
// the bits are the same either way.
std::vector<torch::Tensor> rows(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& colsum128,
                                const torch::Tensor& sq, const c10::optional<torch::Tensor>& bias, int64_t N,
                                bool per_pass, int64_t amx_from, const std::vector<int64_t>& widths) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == GROUP && packed.size(3) == 4, "packed: [N/32, K4/4, 32, 4] int8");
  const int64_t M = x.size(0), K = x.size(1), KB = packed.size(1), K4 = KB * 4, groups = packed.size(0);
  TORCH_CHECK(K <= K4 && K4 - K < 4, "x has ", K, " columns; the packed weight takes ", K4);
  TORCH_CHECK(packed.scalar_type() == torch::kChar && packed.is_contiguous(), "packed: contiguous int8");
  TORCH_CHECK(N >= 0 && N <= groups * GROUP, "rows: N = ", N, " output columns; the packed weight holds ", groups * GROUP);
  TORCH_CHECK(colsum128.scalar_type() == torch::kInt && colsum128.is_contiguous() && colsum128.numel() >= N,
              "colsum128: contiguous int32 [N] (N = ", N, "), got ", colsum128.numel(), " values");
  TORCH_CHECK(sq.scalar_type() == torch::kFloat32 && sq.is_contiguous() && sq.numel() >= N,
              "scales: contiguous float32 [N] (N = ", N, "), got ", sq.numel(), " values");
  std::vector<Out> outs;  // per group: its part
  auto ys = output_parts(x, M, N, groups, widths, GROUP, "rows", bias, outs);
  if (M == 0) return ys;
  std::vector<uint8_t> xu(M * K4);
  std::vector<float> s(M);
  const bool avx2 = use_avx2();
  (avx2 ? quantize_rows_avx2 : quantize_rows)(x.data_ptr<float>(), M, K, K4, per_pass, xu.data(), s.data());
  const std::vector<int16_t> x16 = avx2 ? std::vector<int16_t>(xu.begin(), xu.end()) : std::vector<int16_t>();
  const int8_t* W = packed.data_ptr<int8_t>();
  const int32_t* cs = colsum128.data_ptr<int32_t>();
  const float* sqp = sq.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const bool amx = !avx2 && amx_from > 0 && M >= amx_from && K4 % (4 * AMX_STEP) == 0 && amx_ready();
  share_groups(groups, [&](auto take) {
    int64_t configured = 0;  // the A tile's rows as the tiles are configured on this thread (0: not yet)
    for (int64_t g; (g = take()) >= 0;) {  // a group's weights (KB x 128 bytes) stay in cache across row blocks
      const int64_t step = amx ? AMX_ROWS : MAX_ROWS;
      for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t mb = std::min(step, M - m0);
        if (avx2) {
          group_rows_avx2(mb, W + g * KB * 128, KB, x16.data() + m0 * K4, K4, cs, sqp, s.data() + m0, bp, outs[g], m0,
                          g * GROUP);
          continue;
        }
        if (!amx) {
          GROUP_FNS[mb](W + g * KB * 128, KB, xu.data() + m0 * K4, K4, cs, sqp, s.data() + m0, bp, outs[g], m0,
                        g * GROUP);
          continue;
        }
        if (mb != configured) configure_tiles(configured = mb);
        group_amx(W + g * KB * 128, KB, xu.data() + m0 * K4, K4, mb, cs, sqp, s.data() + m0, bp, outs[g], m0,
                  g * GROUP);
      }
    }
    if (configured) release_tiles();
  });
  return ys;
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

// Defined in int4_gemm_avx512.cpp, attention_avx512.cpp, decoder_step.cpp and gemm_avx2.cpp (the same extension).
std::vector<torch::Tensor> rows4(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& dmins,
                                 const torch::Tensor& scs, const c10::optional<torch::Tensor>& bias, int64_t N,
                                 int64_t amx_from, const std::vector<int64_t>& widths);
std::vector<torch::Tensor> quantize4(const torch::Tensor& weight);
std::vector<torch::Tensor> layout4(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& dmin,
                                   const torch::Tensor& sc, const torch::Tensor& m);
torch::Tensor row_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                            const torch::Tensor& starts, const torch::Tensor& ends,
                            const c10::optional<torch::Tensor>& mask, double scale);
std::vector<torch::Tensor> rotary(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                  const torch::Tensor& sin);
void bind_decoder_step(pybind11::module& m);
void set_avx2(bool on);
int64_t avx2_calls();
void set_row_chunks4_avx2(bool six);

namespace {
std::atomic<bool> dynamic_groups{true};
std::atomic<int64_t> stolen_count{0};
}
bool dynamic_split() { return dynamic_groups.load(std::memory_order_relaxed); }
void count_stolen() { stolen_count.fetch_add(1, std::memory_order_relaxed); }
int64_t stolen_groups() { return stolen_count.load(); }
void set_dynamic_split(bool on) { dynamic_groups.store(on, std::memory_order_relaxed); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rows", &rows, "int8 GEMM over row-quantized activations (AVX-512 VNNI, AMX or AVX2), exact int32 accumulation");
  m.def("pack", &pack, "int8 [N_i, K] parts -> (the GEMM's packed layout, 128 * row sums), one pass");
  m.def("has_amx", &has_amx, "whether the GEMM can use AMX tiles here (the CPU has them and Linux allows them)");
  m.def("rows4", &rows4, "int4 GEMM (Q4_K arithmetic) over row-quantized int8 activations, exact int32 sums");
  m.def("quantize4", &quantize4, "float32 [N, K] -> its Q4_K form (q, d, dmin, sc, m)");
  m.def("layout4", &layout4, "a Q4_K form (q, d, dmin, sc, m) -> the int4 GEMM's layout (packed, dmins, scs)");
  m.def("row_attention", &row_attention, "attention, each query row over its own keys, float32, fixed arithmetic");
  m.def("rotary", &rotary, "transformers' rotary embedding of q and k, element for element, as [B, H, L, D]");
  bind_decoder_step(m);  // DecoderStep: every decoder layer of a step in one call
  m.def("set_avx2", &set_avx2, "run the AVX2 code of the GEMMs and the row attention (the same bits), or not");
  m.def("uses_avx2", &use_avx2, "whether the AVX2 code runs");
  m.def("set_dynamic_split", &set_dynamic_split, "let a thread done with its share of the GEMMs' column groups take "
        "from the end of another's (the default), or keep the equal shares (to measure it; the same bits either way)");
  m.def("stolen_groups", &stolen_groups, "how many column groups a thread took from another's share so far");
  m.def("set_row_chunks4_avx2", &set_row_chunks4_avx2, "the AVX2 int4 code's row chunks: up to 8 rows a call, "
        "then 6 (the default), or 5 rows a call and 4 in two passes (before; to measure it: the same bits either way)");
  m.def("avx2_calls", &avx2_calls, "how many GEMM and attention calls ran the AVX2 code so far");
}
