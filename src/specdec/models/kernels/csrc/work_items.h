// How specdec's GEMMs share their column groups among the threads of a pass (int8_gemm_avx512.cpp,
// int4_gemm_avx512.cpp): each thread starts on an equal contiguous share (one stream through the weights, as
// at::parallel_for's split), and a thread that finishes its share takes groups from the end of another's that is not
// done yet. On a virtual machine two vCPUs often do not run at one speed (measured on the AVX2 EPYC, the same kernel
// pinned to each core at once: 47 and 82 GMAC/s in one minute, 82 and 45 in the next), and an equal split waits for
// the slower one. A group's output depends on its weights and the rows only, never on the thread that computes it,
// so the split changes no bits. set_dynamic_split(false) keeps the equal split (to measure the difference).
#pragma once
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

bool dynamic_split();
void count_stolen();  // (stolen_groups(): how often a thread took from another's share, for the tests)

// Runs work(take) on each thread of the pass (as many as at::parallel_for would start, at most count); take() gives
// the next group not yet taken, or -1 once every group of [0, count) is taken.
template <typename Work>
void share_groups(int64_t count, const Work& work) {
  if (count <= 0) return;
  if (!dynamic_split()) {  // equal contiguous shares
    at::parallel_for(0, count, 1, [&](int64_t a, int64_t b) {
      int64_t g = a;
      work([&]() -> int64_t { return g < b ? g++ : -1; });
    });
    return;
  }
  // each thread's share as one atomic word: its next group (low 32 bits) and its end (high 32 bits); its owner takes
  // from the front, another thread from the back, each with one compare-and-swap, so no group is taken twice
  const int64_t threads = std::min<int64_t>(std::max(at::get_num_threads(), 1), count);
  struct alignas(64) Share {
    std::atomic<uint64_t> word;
  };
  std::vector<Share> shares(threads);
  for (int64_t t = 0; t < threads; ++t)
    shares[t].word.store(static_cast<uint64_t>(count * t / threads) | static_cast<uint64_t>(count * (t + 1) / threads) << 32);
  auto take_from = [&](int64_t t, bool front) -> int64_t {
    uint64_t word = shares[t].word.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t next = word & 0xffffffffu, end = word >> 32;
      if (next >= end) return -1;
      const uint64_t taken = front ? (next + 1) | end << 32 : next | (end - 1) << 32;
      if (shares[t].word.compare_exchange_weak(word, taken, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? next : end - 1);
    }
  };
  at::parallel_for(0, threads, 1, [&](int64_t a, int64_t b) {  // (one share a thread; all of them where it runs inline)
    for (int64_t own = a; own < b; ++own) {
      work([&]() -> int64_t {
        const int64_t g = take_from(own, true);
        if (g >= 0) return g;
        for (int64_t t = 1; t < threads; ++t) {  // its share is done: the others', from their ends
          const int64_t stolen = take_from((own + t) % threads, false);
          if (stolen >= 0) {
            count_stolen();
            return stolen;
          }
        }
        return -1;
      });
    }
  });
}
