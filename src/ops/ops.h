// Math on plain row-major float buffers and weight views. Knows nothing of models, caches
// or policies. Legend: M rows (positions) computed, K input width, N output width,
// L canvas length, H query heads, Hkv key/value heads, D head dim.
//
// Every SIMD kernel has a scalar twin in ops/reference.h; tests compare the two. The
// threaded drivers that pick one set once and run it are the CPU backend's
// (backend/cpu_backend.h); what is left here needs no choice.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/dtype.h"

namespace polestar {

// A weight matrix [N, K] (PyTorch Linear layout: one row per output), used in place from
// the mapped file in its stored type. Rows are `row_bytes` apart.
struct WeightView {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  int64_t row_bytes = 0;

  const uint8_t* Row(int64_t n) const { return data + n * row_bytes; }
};

// Converts row `n` of `w` to floats: out[K] (for loading weights; AVX2 when the CPU has it).
void DequantizeRow(const WeightView& w, int64_t n, float* out);

// cos/sin of every (position, frequency) pair, computed once per model as the reference
// does: angle = float(pos) * inv_freq[i] in fp32, inv_freq[i] = 1 / theta^(2i/D).
struct RopeTable {
  int head_dim = 0;
  std::vector<float> cos, sin;  // [max_positions, D/2]

  RopeTable() = default;
  RopeTable(int head_dim, int max_positions, float theta);
};

// Rotary position embedding on x[M, heads * D] in place, row i at position positions[i].
// Rotate-half pairs (i, i + D/2) (HF LLaDA / Dream); interleaved pairs (2i, 2i+1) when
// `interleaved` (llama.cpp's permuted LLaDA q/k rows).
void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
               bool interleaved);
// The inverse rotation (for keys that must be compared un-rotated).
void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
              bool interleaved);

}  // namespace polestar
