// AMX tile state shared by specdec's GEMMs (int8_gemm_avx512.cpp, int4_gemm_avx512.cpp): the tile configuration
// and whether this process may use the tiles.
#pragma once
#include <immintrin.h>
#include <cstdint>

// Whether this CPU has AMX-TILE and AMX-INT8 and Linux lets the process use the tile state (int8_gemm_avx512.cpp).
bool has_amx();

// ldtilecfg's 64 bytes (palette 1): per tile its rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Configure this thread's tiles: tile t gets rows[t] rows of colsb[t] bytes (t < count).
__attribute__((target("amx-tile")))
inline void configure(const uint8_t* rows, const uint16_t* colsb, int count) {
  TileConfig cfg;
  for (int t = 0; t < count; ++t) {
    cfg.colsb[t] = colsb[t];
    cfg.rows[t] = rows[t];
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // gcc's ldtilecfg names 8 bytes of cfg: keep the other stores
  _tile_loadconfig(&cfg);
}

// Give the tile state back (the thread's tiles are configured again before their next use).
__attribute__((target("amx-tile")))
inline void release_tiles() { _tile_release(); }
