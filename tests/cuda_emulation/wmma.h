// The warp matrix functions (nvcuda::wmma, <mma.h>) of the CUDA emulation, for the shapes the
// kernels use: 16x16x16 tiles of BF16 or F16 operands with an FP32 accumulator. A fragment's
// mapping of elements to lanes is undocumented, so a kernel may only load, multiply, fill and
// store whole fragments; here every lane holds the whole tile. Loads and products are then
// each lane's own; a store writes from lane l only the elements e with e % 32 == l, so a lane
// that reads what its warp stored without a __syncwarp (or __syncthreads) between reads stale
// memory, as it may on a GPU. Pointers and leading dimensions are checked as the GPU needs
// them (32-byte aligned; ldm a multiple of 16 bytes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cuda_emulation {
// Dies unless `pointer` is 32-byte aligned and `ldm` elements of `element_bytes` are a
// multiple of 16 bytes.
void CheckMatrixPointer(const void* pointer, unsigned ldm, size_t element_bytes, const char* what);
}  // namespace cuda_emulation

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

constexpr int kTile = 16;

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == kTile && N == kTile && K == kTile, "the emulation has 16x16x16 tiles only");
  float element[kTile][kTile];  // [row, column] of the tile, whatever the memory layout
};

namespace detail {
inline float ToFloat(float x) { return x; }
inline float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float ToFloat(__half x) { return __half2float(x); }
inline int Lane() { return int(threadIdx.x % warpSize); }
}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, kTile, kTile, kTile, T, Layout>& a, const T* p, unsigned ldm) {
  cuda_emulation::CheckMatrixPointer(p, ldm, sizeof(T), "load_matrix_sync");
  for (int r = 0; r < kTile; ++r) {
    for (int c = 0; c < kTile; ++c) {
      a.element[r][c] =
          detail::ToFloat(std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r]);
    }
  }
}

inline void load_matrix_sync(fragment<accumulator, kTile, kTile, kTile, float>& a, const float* p,
                             unsigned ldm, layout_t layout) {
  cuda_emulation::CheckMatrixPointer(p, ldm, sizeof(float), "load_matrix_sync");
  for (int r = 0; r < kTile; ++r) {
    for (int c = 0; c < kTile; ++c) {
      a.element[r][c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

inline void fill_fragment(fragment<accumulator, kTile, kTile, kTile, float>& a, float value) {
  for (auto& row : a.element) {
    for (float& x : row) x = value;
  }
}

// d = a b + c, each output summed in FP32 (the tensor cores' order is unspecified).
template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, kTile, kTile, kTile, float>& d,
              const fragment<matrix_a, kTile, kTile, kTile, T, LayoutA>& a,
              const fragment<matrix_b, kTile, kTile, kTile, T, LayoutB>& b,
              const fragment<accumulator, kTile, kTile, kTile, float>& c) {
  fragment<accumulator, kTile, kTile, kTile, float> sum;
  for (int r = 0; r < kTile; ++r) {
    for (int col = 0; col < kTile; ++col) {
      float total = c.element[r][col];
      for (int k = 0; k < kTile; ++k) total += a.element[r][k] * b.element[k][col];
      sum.element[r][col] = total;
    }
  }
  d = sum;
}

inline void store_matrix_sync(float* p, const fragment<accumulator, kTile, kTile, kTile, float>& a,
                              unsigned ldm, layout_t layout) {
  cuda_emulation::CheckMatrixPointer(p, ldm, sizeof(float), "store_matrix_sync");
  for (int e = detail::Lane(); e < kTile * kTile; e += warpSize) {
    const int r = e / kTile, c = e % kTile;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = a.element[r][c];
  }
}

}  // namespace nvcuda::wmma
