// The regrouping the AVX-512 grouped-rows kernels share (matmul.cpp on floats, bf16_dot.cpp on
// pairs of BF16 values): sixteen rows of x to a vector, and each column tile's outputs back
// to rows. Plain C++, no intrinsics.
#pragma once

#include <algorithm>
#include <cstdint>

namespace polestar::avx512 {

constexpr int kGroupRows = 16;  // rows of x per vector, one in each lane

// Rows [0, m) of x (each `len` elements, rows `len` apart) in groups of 16, each group
// transposed: out[g * 16 * len + j * 16 + l] = x[(16 g + l) * len + j]; lanes past m are 0.
template <typename T>
void GroupRows(const T* x, int64_t m, int64_t len, T* out) {
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  for (int64_t g = 0; g < groups; ++g) {
    T* group = out + g * kGroupRows * len;
    const int64_t lanes = std::min<int64_t>(kGroupRows, m - g * kGroupRows);
    for (int64_t l = 0; l < lanes; ++l) {
      const T* row = x + (g * kGroupRows + l) * len;
      for (int64_t j = 0; j < len; ++j) group[j * kGroupRows + l] = row[j];
    }
    for (int64_t l = lanes; l < kGroupRows; ++l) {
      for (int64_t j = 0; j < len; ++j) group[j * kGroupRows + l] = T{};
    }
  }
}

// One column tile's outputs, held column by column (yt[c * ldyt + i]), into rows of y:
// y[i * ldy + c] for i < m, c < cols.
inline void StoreColumnTile(const float* yt, int64_t ldyt, int64_t m, int cols, float* y,
                            int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int c = 0; c < cols; ++c) y[i * ldy + c] = yt[c * ldyt + i];
  }
}

}  // namespace polestar::avx512
