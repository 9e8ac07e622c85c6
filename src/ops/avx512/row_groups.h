// The grouped-rows product the AVX-512 kernels share (matmul.cpp on floats, bf16_dot.cpp on
// words of two BF16 values): the rows of x regrouped sixteen to a vector, a panel of 12 weight
// rows copied or converted as stored, tiles of two groups x 12 weight rows that broadcast each
// weight element into 24 accumulators, and each column tile's outputs stored back to rows.
//
// The element arithmetic comes from an Ops type, so this header holds no intrinsics:
//   using Element;  (of x and the panel)   using XVec, WVec, Acc;   static constexpr kDepth;
//   static Acc Zero(), LoadY(const float*);  static void StoreY(float*, Acc);
//   static XVec LoadX(const Element*);  static WVec Broadcast(Element);
//   static Acc MulAdd(Acc, XVec, WVec);  (each output one chain over K in order)
// and, per call, Fill(n0, cols, e0, depth, panel) (panel[c * kDepth + j] = element e0 + j of
// weight row n0 + c) and Prefetch(n0, e0, n_end) (the next Fill's weights).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace polestar::avx512 {

constexpr int kGroupRows = 16;  // rows of x per vector, one in each lane
constexpr int kTileCols = 12;   // weight rows per tile: 12 broadcasts per K step
constexpr int kTileGroups = 2;  // groups of x rows per tile: 24 accumulators + 2 x + 1 broadcast

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

// yt[C, 16 V] (+)= panel[C, depth] · xt[16 V, depth]^T: C weight rows (panel rows
// Ops::kDepth apart) against V groups of x rows (ldg apart, as GroupRows lays them out);
// output c of group v is yt[c * ldyt + 16 v + lane]. The loops unroll completely, so the
// accumulators live in registers.
template <typename Ops, int V, int C>
void GroupedTile(const typename Ops::Element* xt, int64_t ldg, const typename Ops::Element* panel,
                 int64_t depth, float* yt, int64_t ldyt, bool accumulate) {
  static_assert(V >= 1 && V <= kTileGroups && C >= 1 && C <= kTileCols);
  typename Ops::Acc acc[C][V];
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      acc[c][v] = accumulate ? Ops::LoadY(yt + c * ldyt + kGroupRows * v) : Ops::Zero();
    }
  }
  for (int64_t kk = 0; kk < depth; ++kk) {
    typename Ops::XVec xv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) xv[v] = Ops::LoadX(xt + v * ldg + kk * kGroupRows);
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) {
      const typename Ops::WVec w = Ops::Broadcast(panel[c * Ops::kDepth + kk]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[c][v] = Ops::MulAdd(acc[c][v], xv[v], w);
    }
  }
#pragma GCC unroll 12
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) Ops::StoreY(yt + c * ldyt + kGroupRows * v, acc[c][v]);
  }
}

template <typename Ops>
using GroupedTileFn = void (*)(const typename Ops::Element*, int64_t, const typename Ops::Element*,
                               int64_t, float*, int64_t, bool);

template <typename Ops, int V, int... C>
constexpr auto GroupedTilesOf(std::integer_sequence<int, C...>) {
  return std::array<GroupedTileFn<Ops>, kTileCols + 1>{nullptr, GroupedTile<Ops, V, C + 1>...};
}
// kGroupedTiles<Ops>[V - 1][C]: the tile of V groups of x rows and C weight rows.
template <typename Ops>
constexpr std::array<GroupedTileFn<Ops>, kTileCols + 1> kGroupedTiles[kTileGroups] = {
    GroupedTilesOf<Ops, 1>(std::make_integer_sequence<int, kTileCols>()),
    GroupedTilesOf<Ops, 2>(std::make_integer_sequence<int, kTileCols>())};

// Rows [0, m) of x (each `len` elements) against weight rows [n_begin, n_end), written at
// y[i * ldy + (n - n_begin)].
template <typename Ops>
void GroupedColumns(const Ops& ops, const typename Ops::Element* x, int64_t m, int64_t len,
                    int64_t n_begin, int64_t n_end, float* y, int64_t ldy) {
  using Element = typename Ops::Element;
  const int64_t groups = (m + kGroupRows - 1) / kGroupRows;
  const int64_t ldg = kGroupRows * len, ldyt = kGroupRows * groups;
  alignas(64) Element panel[kTileCols * Ops::kDepth];  // [kTileCols, kDepth]
  // Kept per thread (x's at most about 1 MB, a row block's), so steady decoding allocates
  // nothing; filling them costs about 1/N of the products' work.
  thread_local std::vector<Element> xt;  // [groups, len, 16]: x by GroupRows
  thread_local std::vector<float> yt;    // [kTileCols, groups * 16]: a column tile's outputs
  xt.resize(size_t(groups * ldg));
  yt.resize(size_t(kTileCols * ldyt));
  GroupRows(x, m, len, xt.data());
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kTileCols) {
    const int cols = int(std::min<int64_t>(kTileCols, n_end - n0));
    for (int64_t e0 = 0; e0 < len; e0 += Ops::kDepth) {
      const int64_t depth = std::min<int64_t>(Ops::kDepth, len - e0);
      ops.Fill(n0, cols, e0, depth, panel);
      const bool last = e0 + depth >= len;
      ops.Prefetch(last ? n0 + kTileCols : n0, last ? 0 : e0 + depth, n_end);
      for (int64_t g = 0; g < groups; g += kTileGroups) {
        const int64_t v = std::min<int64_t>(kTileGroups, groups - g);
        kGroupedTiles<Ops>[v - 1][size_t(cols)](xt.data() + g * ldg + e0 * kGroupRows, ldg, panel,
                                                depth, yt.data() + g * kGroupRows, ldyt, e0 > 0);
      }
    }
    float* y_tile = y + (n0 - n_begin);  // the column tile's outputs, back to rows
    for (int64_t i = 0; i < m; ++i) {
      for (int c = 0; c < cols; ++c) y_tile[i * ldy + c] = yt[size_t(c * ldyt + i)];
    }
  }
}

}  // namespace polestar::avx512
