// Every AVX2 kernel against its scalar twin over many sizes (tails of every vector width,
// odd K, M = 1..7 and beyond, pointers off alignment), the CPU backend's threaded ops against
// the scalar reference backend and hand-computed values, and the scalar BF16/F16
// conversions against hand-computed bit patterns.
#include "ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/parallel.h"
#include "drift/drift.h"
#include "ops/avx2/avx2.h"
#include "ops/avx512/avx512.h"
#include "ops/isa.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {
namespace {

constexpr float kUlp = std::numeric_limits<float>::epsilon() / 2;  // unit roundoff, 2^-24

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

#define SKIP_WITHOUT_AVX2() \
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "CPU lacks AVX2/FMA/F16C"
#define SKIP_WITHOUT_AVX512() \
  if (!IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ/VNNI"

// ---------------------------------------------------------------------------------------
// Conversions

// An exception leaving an OpenMP region would terminate the process: ParallelFor hands it
// to its caller once every chunk has ended.
TEST(ParallelFor, AChunksExceptionReachesTheCaller) {
  const int threads = ThreadCount();
  SetThreadCount(4);
  std::atomic<int64_t> done{0};
  EXPECT_THROW(ParallelFor(100, 1,
                           [&](int64_t begin, int64_t end) {
                             if (begin <= 50 && 50 < end) throw std::runtime_error("chunk");
                             done += end - begin;
                           }),
               std::runtime_error);
  EXPECT_EQ(done, 75);  // the other three chunks of 25 ran to their end
  SetThreadCount(threads);
}

TEST(Bf16, ToF32IsTheHighHalf) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc040), -3.0f);
  EXPECT_EQ(Bf16ToF32(0x4049), 3.140625f);
  EXPECT_EQ(Bf16ToF32(0x7f80), INFINITY);
  EXPECT_EQ(Bf16ToF32(0xff80), -INFINITY);
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7fc0)));
  EXPECT_EQ(Bf16ToF32(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(Bits(Bf16ToF32(0x8000)), 0x80000000u);       // -0
}

TEST(Bf16, FromF32RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between 0x3f80 and 0x3f81: ties go to the even 0x3f80.
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 and 0x3f82: to the even 0x3f82.
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(F32ToBf16(-3.0f), 0xc040);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(3.14159265f), 0x4049);
}

TEST(Bf16, FromF32OverflowNanAndSubnormals) {
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(F32ToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(F32ToBf16(-INFINITY), 0xff80);
  // NaN stays NaN, quieted, even when rounding the mantissa would carry into infinity.
  EXPECT_EQ(F32ToBf16(FromBits(0x7fc00000)), 0x7fc0);
  EXPECT_EQ(F32ToBf16(FromBits(0x7f800001)), 0x7fc0);
  EXPECT_EQ(F32ToBf16(FromBits(0xffffffff)), 0xffff);
  EXPECT_EQ(F32ToBf16(FromBits(0x00012345)), 0x0001);  // subnormal, rounds down
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000)), 0x0002);  // subnormal tie, to even
  EXPECT_EQ(F32ToBf16(FromBits(0x00008000)), 0x0000);  // half the smallest: to even 0
}

TEST(F16, ToF32) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Bits(F16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToF32(0x7c00), INFINITY);
  EXPECT_EQ(F16ToF32(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
}

TEST(F16, FromF32RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, to even
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

TEST(F16, FromF32OverflowNanAndSubnormals) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // halfway: to even, which is infinity
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e6f), 0xfc00);
  EXPECT_EQ(F32ToF16(INFINITY), 0x7c00);
  const uint16_t nan = F32ToF16(NAN);
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(F32ToF16(1023 * std::ldexp(1.0f, -24)), 0x03ff);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);       // tie between 0 and 1: to 0
  EXPECT_EQ(F32ToF16(3 * std::ldexp(1.0f, -26)), 0x0001);   // 0.75 of the smallest: up
  EXPECT_EQ(F32ToF16(3 * std::ldexp(1.0f, -25)), 0x0002);   // tie between 1 and 2: to 2
  EXPECT_EQ(F32ToF16(-5 * std::ldexp(1.0f, -25)), 0x8002);  // tie between 2 and 3: to 2
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  // A value that rounds up out of the subnormals into the smallest normal.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
}

TEST(F16, EveryFiniteValueRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = F16ToF32(uint16_t(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(F32ToF16(value), bits) << std::hex << bits;
  }
}

TEST(Bf16, EveryNonNanValueRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = Bf16ToF32(uint16_t(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(F32ToBf16(value), bits) << std::hex << bits;
  }
}

// avx2::DequantizeRow converts every one of the 65536 patterns as the scalar code does,
// from a misaligned start and with a tail shorter than a vector.
TEST(Avx2Dequantize, AllSixteenBitPatternsMatchScalar) {
  SKIP_WITHOUT_AVX2();
  for (DType type : {DType::kBF16, DType::kF16}) {
    const int64_t count = 0x10000 + 5;
    std::vector<uint16_t> bits(size_t(count) + 1);
    for (int64_t i = 0; i < count; ++i)
      bits[size_t(i) + 1] = uint16_t(i * 40503);  // odd: a permutation
    const WeightView w{type, reinterpret_cast<const uint8_t*>(bits.data() + 1), 1, count,
                       2 * count};
    std::vector<float> got(static_cast<size_t>(count)), want(static_cast<size_t>(count));
    avx2::DequantizeRow(w, 0, got.data());
    reference::DequantizeRow(w, 0, want.data());
    for (int64_t i = 0; i < count; ++i) {
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << DTypeName(type) << " " << i;
      } else {
        ASSERT_EQ(Bits(got[i]), Bits(want[i])) << DTypeName(type) << " " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// MatMul

// Weights of one type laid out with a row stride of row_bytes (>= the packed row), starting
// `offset` bytes into the buffer so that rows are off the vector alignment.
struct TestWeights {
  std::vector<uint8_t> buffer;
  std::vector<float> values;  // [N, K] the exact values stored
  WeightView view;
};

TestWeights MakeWeights(DType type, int64_t n, int64_t k, int64_t pad_bytes, int64_t offset,
                        std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  TestWeights w;
  const int64_t row_bytes = RowBytes(type, k) + pad_bytes;
  w.buffer.assign(size_t(offset + n * row_bytes + 16), 0xAB);
  w.values.resize(size_t(n * k));
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = w.buffer.data() + offset + r * row_bytes;
    for (int64_t c = 0; c < k; ++c) {
      float value = uniform(rng);
      if (type == DType::kF32) {
        std::memcpy(row + 4 * c, &value, 4);
      } else {
        const uint16_t bits = type == DType::kBF16 ? F32ToBf16(value) : F32ToF16(value);
        value = type == DType::kBF16 ? Bf16ToF32(bits) : F16ToF32(bits);
        std::memcpy(row + 2 * c, &bits, 2);
      }
      w.values[size_t(r * k + c)] = value;
    }
  }
  w.view = WeightView{type, w.buffer.data() + offset, n, k, row_bytes};
  return w;
}

// |got - want| within what two sums of K products may differ by: 2 K u sum_k |x_k w_k|.
void ExpectMatMulClose(const std::vector<float>& x, const TestWeights& w, int64_t m,
                       int64_t n_begin, int64_t n_end, const float* got, const float* want,
                       int64_t ldy, const std::string& label) {
  const int64_t k = w.view.cols;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      double magnitude = 0;
      for (int64_t t = 0; t < k; ++t) {
        magnitude += std::fabs(x[size_t(i * k + t) + 1] * w.values[size_t(n * k + t)]);
      }
      const double tolerance = 2.0 * double(k + 1) * kUlp * magnitude + 1e-30;
      const float g = got[i * ldy + (n - n_begin)], e = want[i * ldy + (n - n_begin)];
      ASSERT_LE(std::fabs(double(g) - double(e)), tolerance)
          << label << " row " << i << " col " << n << ": " << g << " vs " << e;
    }
  }
}

using MatMulColumnsFn = void (*)(const float* x, int64_t m, const WeightView& w, int64_t n_begin,
                                 int64_t n_end, float* y, int64_t ldy);

// `kernel` against reference::MatMulColumns on every weight type, on K from 0 to past two
// panel depths, on the given N and M, with rows and x off the vector alignment and ldy > N.
// Returns how many shapes it checked.
int CheckMatMulShapes(MatMulColumnsFn kernel, const std::vector<int64_t>& widths,
                      const std::vector<int64_t>& row_counts, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<int64_t> depths;
  for (int64_t k = 0; k <= 19; ++k) depths.push_back(k);
  for (int64_t k : {31, 33, 64, 127, 128, 129, 255, 256, 257, 515}) depths.push_back(k);
  const int64_t max_width = *std::max_element(widths.begin(), widths.end());
  int checked = 0;
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t k : depths) {
      // Odd padding and offsets keep rows off 16-, 32- and 64-byte boundaries.
      const int64_t element = BlockBytes(type);
      const TestWeights w = MakeWeights(type, max_width, k, 3 * element, element, rng);
      for (int64_t n : widths) {
        WeightView view = w.view;
        view.rows = n;
        for (int64_t m : row_counts) {
          if ((k * n * m) % 3 != 0 && k > 64) continue;  // thin out the largest cases
          if ((k * n * m) % 7 != 0 && k * n * m > 50000) continue;
          std::vector<float> x(size_t(m * k) + 1);  // [M, K] at x.data() + 1
          for (float& v : x) v = uniform(rng);
          const int64_t ldy = n + 3;
          std::vector<float> got(size_t(m * ldy), -7.0f), want(size_t(m * ldy), -7.0f);
          kernel(x.data() + 1, m, view, 0, n, got.data(), ldy);
          reference::MatMulColumns(x.data() + 1, m, view, 0, n, want.data(), ldy);
          const std::string label = Cat(DTypeName(type), " M=", m, " N=", n, " K=", k);
          ExpectMatMulClose(x, w, m, 0, n, got.data(), want.data(), ldy, label);
          for (int64_t i = 0; i < m; ++i) {  // columns beyond N are left alone
            for (int64_t c = n; c < ldy; ++c) {
              if (got[i * ldy + c] != -7.0f) {
                ADD_FAILURE() << label << ": wrote column " << c;
                return checked;
              }
            }
          }
          if (testing::Test::HasFatalFailure()) return checked;
          ++checked;
        }
      }
    }
  }
  return checked;
}

// Columns [5, 67) of a 70-row matrix: a range that starts and ends inside panels.
void CheckMatMulColumnRange(MatMulColumnsFn kernel, const std::vector<int64_t>& row_counts,
                            std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    const TestWeights w = MakeWeights(type, 70, 37, 0, 0, rng);
    for (int64_t m : row_counts) {
      std::vector<float> x(size_t(m * 37) + 1);
      for (float& v : x) v = uniform(rng);
      const int64_t n_begin = 5, n_end = 67, ldy = 70;
      std::vector<float> got(size_t(m * ldy), 0.0f), want(size_t(m * ldy), 0.0f);
      kernel(x.data() + 1, m, w.view, n_begin, n_end, got.data(), ldy);
      reference::MatMulColumns(x.data() + 1, m, w.view, n_begin, n_end, want.data(), ldy);
      ExpectMatMulClose(x, w, m, n_begin, n_end, got.data(), want.data(), ldy,
                        Cat(DTypeName(type), " M=", m));
    }
  }
}

TEST(Avx2MatMul, MatchesScalarOverShapesTypesAndAlignments) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(7);
  const int checked =
      CheckMatMulShapes(avx2::MatMulColumns, {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 48},
                        {1, 2, 3, 4, 5, 6, 7, 8, 13}, rng);
  EXPECT_GT(checked, 5000);
}

TEST(Avx2MatMul, ColumnRangeInsideTheMatrix) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(8);
  CheckMatMulColumnRange(avx2::MatMulColumns, {1, 3, 4, 9}, rng);
}

// The 512-bit kernel's row tiles (M < 32 or K < 1024): panels of 32 weight rows and tiles up
// to 12 x rows: N around multiples of 16 and 32, every M to 40 (every way of dealing rows
// into tiles, and short K at larger M) and beyond.
TEST(Avx512MatMul, MatchesScalarOverShapesTypesAndAlignments) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 rng(17);
  std::vector<int64_t> row_counts;
  for (int64_t m = 1; m <= 40; ++m) row_counts.push_back(m);
  for (int64_t m : {64, 97}) row_counts.push_back(m);
  const int checked = CheckMatMulShapes(
      avx512::MatMulColumns, {1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 65, 79},
      row_counts, rng);
  EXPECT_GT(checked, 5000);
}

// The grouped-rows path (K >= 1024, with M >= 32 or K a multiple of 1024): column tiles of
// 12 weight rows, x in groups of 16 rows, two groups a tile, K in panels of 256: N around
// multiples of 12, M with full and partial groups and one group alone in its tile, K off
// and on panel boundaries.
TEST(Avx512MatMul, GroupedRowsMatchScalar) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t k : {1024, 1031, 1280, 1537}) {
      const TestWeights w = MakeWeights(type, 37, k, 2 * BlockBytes(type), BlockBytes(type), rng);
      for (int64_t n : {1, 11, 12, 13, 25, 37}) {
        WeightView view = w.view;
        view.rows = n;
        for (int64_t m : {7, 13, 32, 33, 47, 48, 49, 64, 81}) {
          if ((n * m + k) % 3 != 0) continue;  // thin out
          std::vector<float> x(size_t(m * k) + 1);
          for (float& v : x) v = uniform(rng);
          const int64_t ldy = n + 2;
          std::vector<float> got(size_t(m * ldy), -7.0f), want(size_t(m * ldy), -7.0f);
          avx512::MatMulColumns(x.data() + 1, m, view, 0, n, got.data(), ldy);
          reference::MatMulColumns(x.data() + 1, m, view, 0, n, want.data(), ldy);
          const std::string label = Cat(DTypeName(type), " M=", m, " N=", n, " K=", k);
          ExpectMatMulClose(x, w, m, 0, n, got.data(), want.data(), ldy, label);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t c = n; c < ldy; ++c) ASSERT_EQ(got[i * ldy + c], -7.0f) << label;
          }
        }
      }
    }
  }
}

// Long rows of x are swept in row blocks that stay in L2 (about 1 MB each, whole groups of 16
// rows, at least four groups): at K = 6000, M = 100 runs as blocks of 64 and 36 rows.
TEST(Avx512MatMul, ManyLongRowsInBlocks) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t m = 100, n = 40, k = 6000;
  for (DType type : {DType::kBF16, DType::kF16}) {
    const TestWeights w = MakeWeights(type, n, k, 2, 2, rng);
    std::vector<float> x(size_t(m * k) + 1);
    for (float& v : x) v = uniform(rng);
    std::vector<float> got(size_t(m * n)), want(size_t(m * n));
    avx512::MatMulColumns(x.data() + 1, m, w.view, 0, n, got.data(), n);
    reference::MatMulColumns(x.data() + 1, m, w.view, 0, n, want.data(), n);
    ExpectMatMulClose(x, w, m, 0, n, got.data(), want.data(), n, std::string(DTypeName(type)));
  }
}

// Every panel path runs every output as one chain of FMAs over K in order: from M = 7 on
// (past both dot paths) the AVX-512 kernel gives the AVX2 kernel's bits, on row tiles
// (K = 300, or K = 1100 and M < 32) and on grouped rows (K = 1100 and M >= 32, K = 2048).
TEST(Avx512MatMul, PanelPathGivesTheAvx2Bits) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 rng(20);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t k : {300, 1100, 2048}) {
      const TestWeights w = MakeWeights(type, 70, k, 6, 2, rng);
      for (int64_t m : {7, 8, 13, 31, 32, 97}) {
        std::vector<float> x(size_t(m * k) + 1);
        for (float& v : x) v = uniform(rng);
        std::vector<float> wide(size_t(m * 70)), narrow(size_t(m * 70));
        avx512::MatMulColumns(x.data() + 1, m, w.view, 0, 70, wide.data(), 70);
        avx2::MatMulColumns(x.data() + 1, m, w.view, 0, 70, narrow.data(), 70);
        for (size_t i = 0; i < wide.size(); ++i) {
          ASSERT_EQ(Bits(wide[i]), Bits(narrow[i]))
              << DTypeName(type) << " M=" << m << " K=" << k << " " << i;
        }
      }
    }
  }
}

TEST(Avx512MatMul, ColumnRangeInsideTheMatrix) {
  SKIP_WITHOUT_AVX512();
  std::mt19937 rng(18);
  CheckMatMulColumnRange(avx512::MatMulColumns, {1, 3, 4, 9, 13, 32}, rng);
}

// The public entry point: threads over panels, adds the bias, whichever kernel runs (on fp32
// activations: BF16 products have their own bound, bf16_matmul_test.cpp).
TEST(MatMul, ThreadedWithBiasMatchesScalar) {
  std::mt19937 rng(9);
  const CpuBackend best(BestIsa(), ActivationPrecision::kF32);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 300, k = 520;
    const TestWeights w = MakeWeights(type, n, k, 0, 0, rng);
    std::vector<float> bias(static_cast<size_t>(n));
    for (float& v : bias) v = uniform(rng);
    for (int64_t m : {1, 2, 3, 5, 32}) {
      std::vector<float> x(size_t(m * k) + 1);
      for (float& v : x) v = uniform(rng);
      std::vector<float> got(size_t(m * n)), want(size_t(m * n));
      best.MatMul(x.data() + 1, m, w.view, got.data(), bias.data());
      reference::MatMulColumns(x.data() + 1, m, w.view, 0, n, want.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) want[size_t(i * n + j)] += bias[size_t(j)];
      }
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double magnitude = std::fabs(bias[size_t(j)]);
          for (int64_t t = 0; t < k; ++t) {
            magnitude += std::fabs(x[size_t(i * k + t) + 1] * w.values[size_t(j * k + t)]);
          }
          ASSERT_NEAR(got[size_t(i * n + j)], want[size_t(i * n + j)],
                      2.0 * double(k + 2) * kUlp * magnitude)
              << DTypeName(type) << " M=" << m << " row " << i << " col " << j;
        }
      }
    }
  }
  SetThreadCount(saved_threads);
}

// ---------------------------------------------------------------------------------------
// Row and element-wise kernels

std::vector<int64_t> VectorSizes() {
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 2 * 8 + 3; ++n) sizes.push_back(n);
  for (int64_t n : {31, 33, 64, 100, 1000, 4099}) sizes.push_back(n);
  return sizes;
}

std::vector<float> RandomVector(int64_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> v(size_t(n) + 1);  // callers use v.data() + 1: off the alignment
  for (float& x : v) x = uniform(rng);
  return v;
}

TEST(Avx2Vector, DotMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(10);
  for (int64_t n : VectorSizes()) {
    const auto a = RandomVector(n, 1.0f, rng), b = RandomVector(n, 1.0f, rng);
    double magnitude = 0;
    for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(a[i + 1] * b[i + 1]);
    EXPECT_NEAR(avx2::Dot(a.data() + 1, b.data() + 1, n),
                reference::Dot(a.data() + 1, b.data() + 1, n),
                2.0 * double(n + 1) * kUlp * magnitude)
        << "n=" << n;
  }
}

TEST(Avx2Vector, AddInPlaceIsExact) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(11);
  for (int64_t n : VectorSizes()) {
    auto got = RandomVector(n, 10.0f, rng);
    const auto y = RandomVector(n, 10.0f, rng);
    auto want = got;
    avx2::AddInPlace(got.data() + 1, y.data() + 1, n);
    reference::AddInPlace(want.data() + 1, y.data() + 1, n);
    ASSERT_EQ(got, want) << "n=" << n;
  }
}

TEST(Avx2Vector, SiluMulMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(12);
  for (int64_t n : VectorSizes()) {
    auto got = RandomVector(n, 30.0f, rng);  // far enough out that exp saturates
    const auto up = RandomVector(n, 3.0f, rng);
    auto want = got;
    avx2::SiluMul(got.data() + 1, up.data() + 1, n);
    reference::SiluMul(want.data() + 1, up.data() + 1, n);
    for (int64_t i = 1; i <= n; ++i) {
      ASSERT_NEAR(got[i], want[i], 8 * kUlp * std::fabs(want[i]) + 1e-30f)
          << "n=" << n << " i=" << i;
    }
  }
}

TEST(Avx2Vector, SiluMulAtExtremes) {
  SKIP_WITHOUT_AVX2();
  std::vector<float> gate = {-200.0f, -90.0f, -88.5f, -20.0f, 0.0f, 20.0f, 88.5f, 200.0f};
  const std::vector<float> up(gate.size(), 2.0f);
  std::vector<float> want = gate;
  avx2::SiluMul(gate.data(), up.data(), int64_t(gate.size()));
  reference::SiluMul(want.data(), up.data(), int64_t(want.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gate[i])) << i;
    ASSERT_NEAR(gate[i], want[i], 8 * kUlp * std::fabs(want[i]) + 1e-35f) << i;
  }
}

TEST(Avx2Vector, SoftmaxRowMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(13);
  for (float spread : {1.0f, 40.0f, 200.0f}) {
    for (int64_t n : VectorSizes()) {
      auto got = RandomVector(n, spread, rng);
      auto want = got;
      avx2::SoftmaxRow(got.data() + 1, n);
      reference::SoftmaxRow(want.data() + 1, n);
      double total = 0;
      for (int64_t i = 1; i <= n; ++i) {
        // The two totals may differ by 2 (n + 1) ulp, exp by a few ulp per element.
        ASSERT_NEAR(got[i], want[i], (2 * n + 10) * kUlp * want[i] + 1e-37f)
            << "n=" << n << " i=" << i;
        total += got[i];
      }
      if (n > 0) {
        EXPECT_NEAR(total, 1.0, 1e-5) << "n=" << n;
      }
    }
  }
}

TEST(Avx2Vector, RmsNormMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(14);
  for (int64_t m : {1, 2, 3}) {
    for (int64_t c : VectorSizes()) {
      if (c == 0) continue;
      const auto x = RandomVector(m * c, 3.0f, rng);
      const auto weight = RandomVector(c, 2.0f, rng);
      std::vector<float> got(size_t(m * c)), want(size_t(m * c));
      avx2::RmsNorm(x.data() + 1, m, c, weight.data() + 1, 1e-5f, got.data());
      reference::RmsNorm(x.data() + 1, m, c, weight.data() + 1, 1e-5f, want.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 2 * (c + 4) * kUlp * std::fabs(want[i]))
            << "m=" << m << " c=" << c << " i=" << i;
      }
      // In place, as the forward pass uses it for the final norm.
      std::vector<float> in_place(x.begin() + 1, x.end());
      avx2::RmsNorm(in_place.data(), m, c, weight.data() + 1, 1e-5f, in_place.data());
      ASSERT_EQ(in_place, got);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Attention

// Polestar's drift reads these probabilities: the AVX2 kernel must give the scalar one's bits.
TEST(Avx2Attention, SideBySideProbabilitiesEqualTheScalarBits) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(16);
  for (int head_dim : {1, 3, 7, 8, 9, 16, 20, 32, 33, 64, 128}) {
    for (int64_t l : {1, 7, 8, 9, 15, 16, 17, 63, 200}) {
      const int64_t kv_stride = 2 * head_dim + 3;
      const auto q = RandomVector(head_dim, 2.0f, rng);
      const auto k = RandomVector(l * kv_stride, 2.0f, rng);
      const float* k_head = k.data() + head_dim + 1;  // a second head's slice of each row
      std::vector<float> got(static_cast<size_t>(l)), want(static_cast<size_t>(l));
      avx2::HeadProbabilitiesSideBySide(q.data(), k_head, l, kv_stride, head_dim, got.data());
      reference::HeadProbabilitiesSideBySide(q.data(), k_head, l, kv_stride, head_dim, want.data());
      for (int64_t j = 0; j < l; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(j)]), std::bit_cast<uint32_t>(want[size_t(j)]))
            << "D=" << head_dim << " L=" << l << " j=" << j;
      }
    }
  }
}

// Polestar's k-means labels read these similarities: the AVX2 kernel must give the bits of
// the plain loop (sixteen, four and one point at a time, so n covers every path and tail).
TEST(Avx2Exact, DimensionMajorDotsEqualThePlainLoopsBits) {
  SKIP_WITHOUT_AVX2();
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t d : {1, 7, 128}) {
    for (int64_t n : {1, 3, 4, 5, 15, 16, 17, 33, 64, 96}) {
      std::vector<double> x(static_cast<size_t>(d * n));  // [d, n]
      std::vector<double> u(static_cast<size_t>(d));      // [d]
      for (double& v : x) v = normal(rng);
      for (double& v : u) v = normal(rng);
      std::vector<double> got(static_cast<size_t>(n));   // [n]
      std::vector<double> want(static_cast<size_t>(n));  // [n]
      avx2::DimensionMajorDots(x.data(), n, d, u.data(), got.data());
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < d; ++j) {
          const double product = x[size_t(j * n + i)] * u[size_t(j)];
          sum += product;  // rounded apart from the product, as without fused multiply-add
        }
        want[size_t(i)] = sum;
      }
      ASSERT_EQ(got, want) << "d=" << d << " n=" << n;
      reference::DimensionMajorDots(x.data(), n, d, u.data(), got.data());
      ASSERT_EQ(got, want) << "d=" << d << " n=" << n;
    }
  }
}

TEST(Avx2Attention, AttendHeadMatchesScalar) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(15);
  std::vector<int64_t> lengths;
  for (int64_t l = 1; l <= 19; ++l) lengths.push_back(l);
  for (int64_t l : {40, 101}) lengths.push_back(l);
  for (int head_dim : {1, 2, 3, 7, 8, 9, 16, 17, 24, 63, 64, 72, 128, 130}) {
    for (int64_t l : lengths) {
      const int64_t kv_stride = 2 * head_dim + 3;
      const auto q = RandomVector(head_dim, 2.0f, rng);
      const auto k = RandomVector(l * kv_stride, 2.0f, rng);
      const auto v = RandomVector(l * kv_stride, 1.0f, rng);
      std::vector<float> got_p(static_cast<size_t>(l)), want_p(static_cast<size_t>(l));
      std::vector<float> got(static_cast<size_t>(head_dim) + 1);  // written at got.data() + 1
      std::vector<float> want(static_cast<size_t>(head_dim));
      // This head's slice starts head_dim + 1 floats into each row.
      const float* k_head = k.data() + 1 + head_dim + 1;
      const float* v_head = v.data() + 1 + head_dim + 1;
      avx2::AttendHead(q.data() + 1, k_head, v_head, l, kv_stride, head_dim, got_p.data(),
                       got.data() + 1);
      reference::AttendHead(q.data() + 1, k_head, v_head, l, kv_stride, head_dim, want_p.data(),
                            want.data());
      const std::string label = Cat("D=", head_dim, " L=", l);
      // A score's rounding error is at most 2 (D + 1) u sum_d |q_d k_jd| / sqrt(D); the
      // softmax doubles it (the max and the total shift too) and adds exp's and the total's.
      double score_error = 0;
      for (int64_t j = 0; j < l; ++j) {
        double magnitude = 0;
        for (int d = 0; d < head_dim; ++d)
          magnitude += std::fabs(q[d + 1] * k_head[j * kv_stride + d]);
        score_error =
            std::max(score_error, 2.0 * (head_dim + 1) * kUlp * magnitude / std::sqrt(head_dim));
      }
      const double prob_tolerance = 2 * score_error + (2 * l + 10) * kUlp;
      for (int64_t j = 0; j < l; ++j) {
        ASSERT_NEAR(got_p[j], want_p[j], prob_tolerance * want_p[j] + 1e-37) << label << " j=" << j;
      }
      for (int d = 0; d < head_dim; ++d) {
        double weighted = 0;
        for (int64_t j = 0; j < l; ++j)
          weighted += want_p[j] * std::fabs(v_head[j * kv_stride + d]);
        ASSERT_NEAR(got[d + 1], want[d], (prob_tolerance + 2 * (l + 1) * kUlp) * weighted + 1e-30)
            << label << " d=" << d;
      }
    }
  }
}

TEST(Attention, ThreadedGroupedHeadsMatchScalar) {
  std::mt19937 rng(16);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int heads = 6, kv_heads = 2, head_dim = 24;
  const int64_t m = 5, l = 37;
  const auto q = RandomVector(m * heads * head_dim, 1.0f, rng);
  const auto k = RandomVector(l * kv_heads * head_dim, 1.0f, rng);
  const auto v = RandomVector(l * kv_heads * head_dim, 1.0f, rng);
  std::vector<float> got(size_t(m * heads * head_dim)), want(got.size()), no_probs(got.size());
  std::vector<float> got_p(size_t(m * heads * l)), want_p(got_p.size());
  const CpuBackend& backend = CpuBackend::Host();
  backend.Attention(q.data() + 1, m, k.data() + 1, v.data() + 1, l, heads, kv_heads, head_dim,
                    got.data(), got_p.data());
  backend.Attention(q.data() + 1, m, k.data() + 1, v.data() + 1, l, heads, kv_heads, head_dim,
                    no_probs.data());
  reference::Attention(q.data() + 1, m, k.data() + 1, v.data() + 1, l, heads, kv_heads, head_dim,
                       want.data(), want_p.data());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f) << i;
    ASSERT_EQ(no_probs[i], got[i]) << i;
  }
  for (size_t i = 0; i < got_p.size(); ++i) ASSERT_NEAR(got_p[i], want_p[i], 1e-6f) << i;
  SetThreadCount(saved_threads);
}

// ---------------------------------------------------------------------------------------
// The CPU backend: the best kernels, threaded, against the scalar reference backend.

TEST(CpuBackend, ChoosesItsKernelsOnce) {
  EXPECT_EQ(CpuBackend::Host().isa(), BestIsa());
  EXPECT_TRUE(IsaSupported(BestIsa()));
  EXPECT_EQ(CpuBackend(Isa::kScalar).name(), "cpu-scalar");
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) {
      EXPECT_EQ(CpuBackend(isa).name(), "cpu-" + std::string(IsaName(isa)));
    } else {
      EXPECT_THROW(CpuBackend{isa}, Error);
    }
  }
}

TEST(CpuBackend, BuffersAreZeroedCopiedDeepAndGrownOnlyWhenTooSmall) {
  const CpuBackend& backend = CpuBackend::Host();
  Buffer a(backend, 5);
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.data()[i], 0.0f);
  a.data()[2] = 7;
  Buffer b = a;
  b.data()[2] = 8;
  EXPECT_EQ(a.data()[2], 7.0f);
  EXPECT_EQ(b.data()[2], 8.0f);
  const float* before = a.data();
  a.Reserve(3);  // fits: nothing moves, contents stay
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(a.data()[2], 7.0f);
  a.Reserve(64);
  EXPECT_EQ(a.size(), 64);
  Buffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(moved.data()[2], 8.0f);
}

TEST(CpuBackend, RowOpsMatchTheReferenceBackend) {
  std::mt19937 rng(21);
  const CpuBackend& best = CpuBackend::Host();
  const CpuBackend scalar(Isa::kScalar);
  const int64_t m = 7, c = 77;
  const auto x = RandomVector(m * c, 2.0f, rng), weight = RandomVector(c, 1.0f, rng);
  std::vector<float> got(size_t(m * c)), want(got.size());
  best.RmsNorm(x.data() + 1, m, c, weight.data() + 1, 1e-5f, got.data());
  scalar.RmsNorm(x.data() + 1, m, c, weight.data() + 1, 1e-5f, want.data());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])));

  auto gate = RandomVector(m * c, 6.0f, rng);
  auto gate_want = gate;
  const auto up = RandomVector(m * c, 1.0f, rng);
  best.SiluMul(gate.data() + 1, up.data() + 1, m * c);
  scalar.SiluMul(gate_want.data() + 1, up.data() + 1, m * c);
  for (size_t i = 1; i < gate.size(); ++i)
    ASSERT_NEAR(gate[i], gate_want[i], 1e-5f * (1 + std::fabs(gate_want[i])));

  auto sum = RandomVector(m * c, 1.0f, rng);
  auto sum_want = sum;
  best.AddInPlace(sum.data() + 1, up.data() + 1, m * c);
  scalar.AddInPlace(sum_want.data() + 1, up.data() + 1, m * c);
  EXPECT_EQ(sum, sum_want);  // exact
}

TEST(CpuBackend, MatMulAndLmHeadMatchTheReferenceBackend) {
  std::mt19937 rng(22);
  const CpuBackend best(BestIsa(), ActivationPrecision::kF32);  // the fp32 products
  const CpuBackend scalar(Isa::kScalar);
  const int64_t m = 3, n = 70, k = 96;
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    const TestWeights w = MakeWeights(type, n, k, 0, 0, rng);
    auto x = RandomVector(m * k, 1.0f, rng);
    std::vector<float> got(size_t(m * n)), want(got.size());
    best.MatMul(x.data() + 1, m, w.view, got.data());
    scalar.MatMul(x.data() + 1, m, w.view, want.data());
    ExpectMatMulClose(x, w, m, 0, n, got.data(), want.data(), n, std::string(DTypeName(type)));

    // LM head: rmsnorm in place, then the projection; the norm's reference computed by hand.
    const auto norm = RandomVector(k, 1.0f, rng);
    std::vector<float> rows(x.begin() + 1, x.end()), normed(rows.size());  // [M, K]
    reference::RmsNorm(rows.data(), m, k, norm.data() + 1, 1e-6f, normed.data());
    best.LmHead(rows.data(), m, k, norm.data() + 1, 1e-6f, w.view, got.data());
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_NEAR(rows[i], normed[i], 1e-5f);
    reference::MatMulColumns(normed.data(), m, w.view, 0, n, want.data(), n);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f);
  }
}

// Each SIMD kernel set's MatMul on fp32 activations, threaded over panels (chunk edges fall
// on 16-row panels, so the 512-bit kernel also gets ranges ending in half panels), against
// the scalar backend.
TEST(CpuBackend, EveryKernelSetsMatMulMatchesTheReferenceBackend) {
  std::mt19937 rng(23);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const CpuBackend scalar(Isa::kScalar);
  const int64_t n = 300, k = 300;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    const CpuBackend backend(isa, ActivationPrecision::kF32);
    for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
      const TestWeights w = MakeWeights(type, n, k, 0, 0, rng);
      for (int64_t m : {1, 3, 8, 32, 45}) {
        auto x = RandomVector(m * k, 1.0f, rng);
        std::vector<float> got(size_t(m * n)), want(got.size());
        backend.MatMul(x.data() + 1, m, w.view, got.data());
        scalar.MatMul(x.data() + 1, m, w.view, want.data());
        ExpectMatMulClose(x, w, m, 0, n, got.data(), want.data(), n,
                          Cat(IsaName(isa), " ", DTypeName(type), " M=", m));
      }
    }
  }
  SetThreadCount(saved_threads);
}

TEST(CpuBackend, RopeUndoesItselfAndRotatesPairsByTheTable) {
  const RopeTable table(4, 4, 8, 10000.0f);
  const CpuBackend& backend = CpuBackend::Host();
  // One head of D = 4 at position 3: pairs (0, 2) and (1, 3) turn by 3 * theta^(-2f/D).
  std::vector<float> x = {1, 0, 0, 0};
  const int position[1] = {3};
  backend.ApplyRope(x.data(), position, 1, table, false);
  EXPECT_NEAR(x[0], std::cos(3.0f), 1e-6f);
  EXPECT_NEAR(x[2], std::sin(3.0f), 1e-6f);
  backend.UndoRope(x.data(), position, 1, table, false);
  EXPECT_NEAR(x[0], 1.0f, 1e-6f);
  EXPECT_NEAR(x[2], 0.0f, 1e-6f);
}

TEST(CpuBackend, PartialRopeTurnsOnlyTheFirstRotaryDims) {
  // D = 8, R = 4 (partial_rotary_factor 0.5): pairs (0, 2) and (1, 3) turn by
  // p * theta^(-2f/R); dims 4..7 pass unchanged.
  const RopeTable table(8, 4, 8, 100.0f);
  std::vector<float> x = {1, 1, 0, 0, 5, 6, 7, 8};
  const int position[1] = {2};
  CpuBackend::Host().ApplyRope(x.data(), position, 1, table, false);
  const float angle1 = 2.0f / 10.0f;  // 2 * 100^(-2/4)
  EXPECT_NEAR(x[0], std::cos(2.0f), 1e-6f);
  EXPECT_NEAR(x[2], std::sin(2.0f), 1e-6f);
  EXPECT_NEAR(x[1], std::cos(angle1), 1e-6f);
  EXPECT_NEAR(x[3], std::sin(angle1), 1e-6f);
  EXPECT_EQ(std::vector<float>(x.begin() + 4, x.end()), (std::vector<float>{5, 6, 7, 8}));
}

TEST(Routing, TopKOfSoftmaxWithBiasNormalisationAndScaling) {
  // Two rows over 4 experts. Row 0: softmax of log(1, 2, 3, 4) = (0.1, 0.2, 0.3, 0.4).
  // Row 1: equal logits, so ties go to the lower index.
  const float logits[8] = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f),
                           1.0f, 1.0f,           1.0f,           1.0f};
  int chosen[4];
  float weights[4];
  RouterSpec spec{.experts = 4, .top_k = 2};
  RouteTopK(logits, 2, spec, chosen, weights);
  EXPECT_EQ(std::vector<int>(chosen, chosen + 4), (std::vector<int>{3, 2, 0, 1}));
  EXPECT_NEAR(weights[0], 0.4f, 1e-6f);
  EXPECT_NEAR(weights[1], 0.3f, 1e-6f);
  EXPECT_NEAR(weights[2], 0.25f, 1e-6f);
  // A bias of 0.25 on expert 0 lifts it to 0.35 in row 0: chosen, and kept in its weight.
  const float bias[4] = {0.25f, 0, 0, 0};
  spec.bias = bias;
  RouteTopK(logits, 1, spec, chosen, weights);
  EXPECT_EQ(std::vector<int>(chosen, chosen + 2), (std::vector<int>{3, 0}));
  EXPECT_NEAR(weights[1], 0.35f, 1e-6f);
  // Renormalised to sum 1, then scaled.
  spec.bias = nullptr;
  spec.normalize = true;
  spec.scaling = 2.0f;
  RouteTopK(logits, 1, spec, chosen, weights);
  EXPECT_NEAR(weights[0], 2.0f * 0.4f / 0.7f, 1e-6f);
  EXPECT_NEAR(weights[1], 2.0f * 0.3f / 0.7f, 1e-6f);
}

// Each row adds its slots' weighted rows in slot order: row 0 slots 0 and 2, row 1 slots 1
// and 3.
TEST(Routing, CombineExpertsAddsEachRowsWeightedSlots) {
  const float src[8] = {1, 2, 3, 4, 5, 6, 7, 8};  // [4 slots, 2]
  std::vector<float> dst = {10, 10, 20, 20};      // [2, 2]
  const float scales[4] = {0.5f, -1.0f, 2.0f, 0.25f};
  const int slots[4] = {0, 2, 1, 3};  // [M = 2, k = 2]
  CpuBackend::Host().CombineExperts(src, scales, slots, 2, 2, 2, dst.data());
  EXPECT_EQ(dst, (std::vector<float>{10 + 0.5f + 10, 10 + 1 + 12, 20 - 3 + 1.75f, 20 - 4 + 2}));
}

TEST(CpuBackend, AttentionProbabilitiesAreTheAttentionsProbabilities) {
  std::mt19937 rng(23);
  const int heads = 4, kv_heads = 2, head_dim = 20;
  const int64_t m = 3, l = 29;
  const auto q = RandomVector(m * heads * head_dim, 1.0f, rng);
  const auto k = RandomVector(l * kv_heads * head_dim, 1.0f, rng);
  const auto v = RandomVector(l * kv_heads * head_dim, 1.0f, rng);
  std::vector<float> out(size_t(m * heads * head_dim)), with_values(size_t(m * heads * l));
  std::vector<float> got(with_values.size()), want(with_values.size());
  // The scalar kernel on every kernel set: bit for bit the reference attention's
  // probabilities, and within rounding of the best attention's.
  reference::Attention(q.data() + 1, m, k.data() + 1, v.data() + 1, l, heads, kv_heads, head_dim,
                       out.data(), want.data());
  for (const Isa isa : {BestIsa(), Isa::kScalar}) {
    const CpuBackend backend(isa);
    backend.AttentionProbabilities(q.data() + 1, m, k.data() + 1, l, heads, kv_heads, head_dim,
                                   got.data());
    EXPECT_EQ(got, want);
    backend.Attention(q.data() + 1, m, k.data() + 1, v.data() + 1, l, heads, kv_heads, head_dim,
                      out.data(), with_values.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], with_values[i], 1e-6f) << i;
  }
}

TEST(CpuBackend, CopyRowsGathersAndScatters) {
  const CpuBackend& backend = CpuBackend::Host();
  const std::vector<float> src = {0, 1, 10, 11, 20, 21};  // [3, 2]
  std::vector<float> gathered(4);
  const int rows[2] = {2, 0};
  backend.CopyRows(src.data(), rows, gathered.data(), {}, 2);
  EXPECT_EQ(gathered, (std::vector<float>{20, 21, 0, 1}));
  std::vector<float> scattered(6, -1);
  backend.CopyRows(gathered.data(), {}, scattered.data(), rows, 2);
  EXPECT_EQ(scattered, (std::vector<float>{0, 1, -1, -1, 20, 21}));
  std::vector<float> both(6, -1);
  const int from[1] = {1}, to[1] = {2};
  backend.CopyRows(src.data(), from, both.data(), to, 2);
  EXPECT_EQ(both, (std::vector<float>{-1, -1, -1, -1, 10, 11}));
}

// Rows of 2 taken from a matrix 3 wide into one 4 wide and back out: each row lands at its
// stride, and neither the columns past the width nor the rows past the count are written.
TEST(CpuBackend, CopyStridedLaysRowsAtTheirStrides) {
  const CpuBackend& backend = CpuBackend::Host();
  const std::vector<float> src = {0, 1, 2, 10, 11, 12, 20, 21, 22};  // [3, 3]
  std::vector<float> dst(13, -1);                                    // [3, 4] + 1 past the end
  backend.CopyStrided(src.data() + 1, 3, dst.data() + 1, 4, 2, 2);
  EXPECT_EQ(dst, (std::vector<float>{-1, 1, 2, -1, -1, 11, 12, -1, -1, -1, -1, -1, -1}));
  std::vector<float> narrow(6, -2);  // [2, 2] read back out of the wide one + 2 past the end
  backend.CopyStrided(dst.data() + 1, 4, narrow.data(), 2, 2, 2);
  EXPECT_EQ(narrow, (std::vector<float>{1, 2, 11, 12, -2, -2}));
}

TEST(CpuBackend, EmbedLooksUpTheTokensOfTheRows) {
  std::mt19937 rng(24);
  const TestWeights table = MakeWeights(DType::kBF16, 5, 16, 0, 0, rng);
  const std::vector<int> tokens = {4, 1, 3};
  const int rows[2] = {2, 0};
  std::vector<float> out(32);
  CpuBackend::Host().Embed(table.view, tokens, rows, out.data());
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(out[size_t(c)], table.values[size_t(3 * 16 + c)]);
    EXPECT_EQ(out[size_t(16 + c)], table.values[size_t(4 * 16 + c)]);
  }
}

// A chain of distributions compared in turn, as Polestar compares each step's attention with
// the last step's: reusing each one's logs the next time gives the KL of reference.h bit for
// bit, including the entries below the floor.
TEST(CpuBackend, KlWithKeptLogsHasTheBitsOfTheReference) {
  const CpuBackend& backend = CpuBackend::Host();
  constexpr int kRows = 3, kHeads = 2;
  constexpr int64_t kKeys = 37, kSize = kRows * kHeads * kKeys;
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<float>> chain(4, std::vector<float>(size_t(kSize)));  // [R, H, L] each
  for (std::vector<float>& probs : chain) {
    for (float& p : probs) {  // some entries below the floor, at it and at zero
      const float u = uniform(rng);
      p = u < 0.05f ? 1e-14f : u < 0.08f ? 1e-12f : u < 0.1f ? 0.0f : uniform(rng);
    }
  }
  std::vector<double> before_logs;  // [R, H, L]
  for (size_t t = 1; t < chain.size(); ++t) {
    std::vector<double> logs(static_cast<size_t>(kSize)), kept(kRows),
        plain(kRows);  // [R, H, L], [R], [R]
    backend.HeadMeanDrift(DriftMetric::kKl, chain[t].data(), chain[t - 1].data(), kRows, kHeads,
                          kKeys, kept.data(),
                          {logs.data(), before_logs.empty() ? nullptr : before_logs.data()});
    backend.HeadMeanDrift(DriftMetric::kKl, chain[t].data(), chain[t - 1].data(), kRows, kHeads,
                          kKeys, plain.data());
    for (int r = 0; r < kRows; ++r) {
      double expected = 0;
      for (int h = 0; h < kHeads; ++h) {
        const int64_t offset = (r * kHeads + h) * kKeys;
        expected +=
            reference::KlDivergence(chain[t].data() + offset, chain[t - 1].data() + offset, kKeys);
      }
      EXPECT_GT(kept[size_t(r)], 0.0);
      EXPECT_EQ(kept[size_t(r)], expected / kHeads) << "step " << t << " row " << r;
      EXPECT_EQ(plain[size_t(r)], expected / kHeads) << "step " << t << " row " << r;
    }
    for (int64_t i = 0; i < kSize; ++i) {
      ASSERT_EQ(logs[size_t(i)], std::log(double(std::max(chain[t][size_t(i)], 1e-12f))));
    }
    before_logs = std::move(logs);
  }
}

TEST(CpuBackend, DriftMatchesHandComputedValues) {
  const CpuBackend& backend = CpuBackend::Host();
  // Two rows, two heads, L = 2: row 0 differs in head 0 only; row 1 not at all.
  const std::vector<float> now = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 1.0f, 0.0f};
  const std::vector<float> before = {0.25f, 0.75f, 0.5f, 0.5f, 0.5f, 0.5f, 1.0f, 0.0f};
  std::vector<double> drift(2);
  backend.HeadMeanDrift(DriftMetric::kKl, now.data(), before.data(), 2, 2, 2, drift.data());
  EXPECT_NEAR(drift[0], (0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)) / 2, 1e-7);
  EXPECT_NEAR(drift[1], 0.0, 1e-9);  // zero entries floored on both sides
  backend.HeadMeanDrift(DriftMetric::kCosine, now.data(), before.data(), 2, 2, 2, drift.data());
  EXPECT_NEAR(drift[0], (1 - (0.5 * 0.25 + 0.5 * 0.75) / (std::sqrt(0.5) * std::sqrt(0.625))) / 2,
              1e-7);
  EXPECT_NEAR(drift[1], 0.0, 1e-12);

  // Across heads: key j of row i compares (now[i, 0, j], now[i, 1, j]) with before's.
  // now row 1 against before row 0: key 0 (0.5, 1) vs (0.25, 0.5): cos 1; key 1 (0.5, 0) vs
  // (0.75, 0.5): 0.75 / sqrt(0.8125).
  const int now_rows[1] = {1};
  EXPECT_NEAR(backend.MeanCrossHeadCosine(now.data(), now_rows, before.data(), 2, 2),
              (1.0 + 0.75 / std::sqrt(0.8125)) / 2, 1e-7);
}

// ---------------------------------------------------------------------------------------
// Elastic-Cache's most-attended keys and a mixture's grouping by expert, against loops written
// as the host code before them ran (the policy's, the forward's), outputs poisoned first.

// The mass of a key is the policy's host sum: per listed row in order, j over H*L into key
// j % L, in double: bit for bit, whatever the rows' order and repeats.
TEST(CpuBackend, AttentionMassIsTheRowsThenHeadsSumInDouble) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const int heads = 5;
  const int64_t keys = 37, rows = 6;
  std::vector<float> probs(size_t(rows * heads * keys));  // [rows, H, L]
  for (float& p : probs) p = uniform(rng);
  const std::vector<int> chosen = {4, 0, 5, 0};
  std::vector<double> expected(size_t(keys), 0.0);  // [L]
  for (const int r : chosen) {
    const float* paid = probs.data() + int64_t(r) * heads * keys;
    for (int64_t j = 0; j < heads * keys; ++j) expected[size_t(j % keys)] += paid[j];
  }
  std::vector<double> mass(size_t(keys), std::nan(""));
  CpuBackend::Host().AttentionMass(probs.data(), chosen, heads, keys, mass.data());
  for (int64_t j = 0; j < keys; ++j) EXPECT_EQ(mass[size_t(j)], expected[size_t(j)]) << j;
  // No rows: no mass.
  std::fill(mass.begin(), mass.end(), std::nan(""));
  CpuBackend::Host().AttentionMass(probs.data(), {}, heads, keys, mass.data());
  EXPECT_EQ(mass, std::vector<double>(size_t(keys), 0.0));
}

// The policy's ranking: the eligible keys by mass, largest first, ties to the lower key, cut
// anywhere (inside a run of ties too), and keys outside the list never chosen.
TEST(CpuBackend, TopKeysRanksByMassThenKey) {
  const std::vector<double> mass = {0.5, 2.0, 0.5, 7.0, 0.5, 2.0, 9.0, 0.25};  // [L]
  const std::vector<int> keys = {0, 1, 2, 4, 5, 7};  // 3 and 6 (the largest) not eligible
  for (size_t k = 0; k <= keys.size(); ++k) {
    std::vector<int> expected = keys;
    std::stable_sort(expected.begin(), expected.end(),
                     [&](int a, int b) { return mass[size_t(a)] > mass[size_t(b)]; });
    expected.resize(k);
    std::vector<int> top(k, -1);
    CpuBackend::Host().TopKeys(mass.data(), keys, top);
    EXPECT_EQ(top, expected) << k;
  }
  const std::vector<int> three = {1, 5, 0};  // ties 1 and 5: the lower first; then 0
  std::vector<int> top(3, -1);
  CpuBackend::Host().TopKeys(mass.data(), keys, top);
  EXPECT_EQ(top, three);
}

// The grouping the forward built on the host: per expert, in expert order, the rows that
// chose it ascending with their weights, and per sequence the count of its rows; sequences
// of any size, none included, and experts nobody chose.
TEST(CpuBackend, GroupByExpertIsAStableCountingSort) {
  std::mt19937 rng(42);
  const int experts = 7, k = 3;
  const std::vector<int64_t> segments = {3, 0, 6, 1};  // [S] rows per sequence
  const int64_t m = 10, sequences = int64_t(segments.size());
  std::vector<int> chosen(size_t(m * k));     // [M, k] distinct experts per row, not sorted
  std::vector<float> weights(size_t(m * k));  // [M, k]
  std::vector<int> order(static_cast<size_t>(experts));  // [E]
  for (int64_t r = 0; r < m; ++r) {
    for (int e = 0; e < experts; ++e) order[size_t(e)] = e;
    std::shuffle(order.begin(), order.end() - 1, rng);  // expert 6 is never chosen
    for (int i = 0; i < k; ++i) {
      chosen[size_t(r * k + i)] = order[size_t(i)];
      weights[size_t(r * k + i)] = float(r * k + i) + 0.5f;
    }
  }
  std::vector<int> expected_rows, expected_counts(size_t(sequences * experts), 0);
  std::vector<float> expected_weights;
  for (int e = 0; e < experts; ++e) {
    int64_t row = 0;
    for (int64_t s = 0; s < sequences; ++s) {
      for (int64_t end = row + segments[size_t(s)]; row < end; ++row) {
        for (int i = 0; i < k; ++i) {
          if (chosen[size_t(row * k + i)] != e) continue;
          expected_rows.push_back(int(row));
          expected_weights.push_back(weights[size_t(row * k + i)]);
          ++expected_counts[size_t(s * experts + e)];
        }
      }
    }
  }
  // A row's slots: the places it holds in the grouped rows, ascending.
  std::vector<int> expected_slots;
  for (int64_t r = 0; r < m; ++r) {
    for (size_t at = 0; at < expected_rows.size(); ++at) {
      if (expected_rows[at] == r) expected_slots.push_back(int(at));
    }
  }
  std::vector<int> rows(size_t(m * k), -7), counts(size_t(sequences * experts), -7),
      slots(size_t(m * k), -7);
  std::vector<float> row_weights(size_t(m * k), std::nanf(""));
  CpuBackend::Host().GroupByExpert(chosen.data(), weights.data(), segments, experts, k, rows.data(),
                                   row_weights.data(), counts.data(), slots.data());
  EXPECT_EQ(rows, expected_rows);
  EXPECT_EQ(slots, expected_slots);
  EXPECT_EQ(row_weights, expected_weights);
  EXPECT_EQ(counts, expected_counts);
  EXPECT_EQ(counts[size_t(2 * experts + 6)], 0);
}

TEST(CpuBackend, GatherRowsTakesTheListedRows) {
  const std::vector<float> src = {0, 1, 10, 11, 20, 21};  // [3, 2]
  const std::vector<int> rows = {2, 0, 2};
  std::vector<float> out(8, -1);  // [3, 2] + 2 past the end
  CpuBackend::Host().GatherRows(src.data(), rows.data(), 3, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1, 20, 21, -1, -1}));
}

// ---------------------------------------------------------------------------------------
// Batch invariance: every output's bits depend on its own row (and, for the float kernels,
// on the dot / panel path its call takes), never on the other rows, the row's position, the
// range of columns a call or thread covers, or where an element falls in a vector.

// The float kernels' outputs against one-row calls (dot path) and a 13-row call (panel path),
// for calls of every row count at several row offsets, over column ranges cut anywhere.
TEST(MatMulColumns, EveryOutputHasTheBitsOfItsRowOnItsPath) {
  struct Kernel {
    Isa isa;
    MatMulColumnsFn columns;
    int64_t (*dot_path_max_rows)(DType);
  };
  std::vector<Kernel> kernels = {
      {Isa::kScalar, reference::MatMulColumns, [](DType) { return int64_t(0); }}};
  if (IsaSupported(Isa::kAvx2))
    kernels.push_back({Isa::kAvx2, avx2::MatMulColumns, avx2::DotPathMaxRows});
  if (IsaSupported(Isa::kAvx512))
    kernels.push_back({Isa::kAvx512, avx512::MatMulColumns, avx512::DotPathMaxRows});
  std::mt19937 rng(40);
  const int64_t n = 75, k = 301, rows = 20, panel_rows = 13;
  for (const Kernel& kernel : kernels) {
    for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
      const int64_t dot_max = kernel.dot_path_max_rows(type);
      ASSERT_LT(dot_max, panel_rows);
      const TestWeights w = MakeWeights(type, n, k, 2, 1, rng);
      const auto x = RandomVector(rows * k, 1.0f, rng);  // [rows, K] at x.data() + 1
      // want[i, N]: row i by its dot path alone; panel[i, N]: rows 0..12 by the panel path.
      std::vector<float> dot(size_t(rows * n)), panel(size_t(panel_rows * n));
      for (int64_t i = 0; i < rows; ++i) {
        kernel.columns(x.data() + 1 + i * k, 1, w.view, 0, n, dot.data() + i * n, n);
      }
      kernel.columns(x.data() + 1, panel_rows, w.view, 0, n, panel.data(), n);
      for (int64_t m = 1; m <= panel_rows; ++m) {
        const bool dot_path = m <= dot_max;
        for (int64_t first : {int64_t(0), int64_t(1), int64_t(5)}) {
          if (!dot_path && first + m > panel_rows) continue;
          // Columns in three calls, cut at boundaries that move with m and first.
          const int64_t cut1 = 1 + (m * 7 + first) % 30, cut2 = cut1 + 1 + (m * 11) % 37;
          std::vector<float> got(size_t(m * n), -1.0f);  // [M, N]
          for (auto [begin, end] : {std::pair{int64_t(0), cut1}, {cut1, cut2}, {cut2, n}}) {
            kernel.columns(x.data() + 1 + first * k, m, w.view, begin, end, got.data() + begin, n);
          }
          const float* want = dot_path ? dot.data() : panel.data();
          ASSERT_EQ(std::memcmp(got.data(), want + first * n, got.size() * 4), 0)
              << IsaName(kernel.isa) << " " << DTypeName(type) << " M=" << m
              << " first row=" << first;
        }
      }
    }
  }
}

// Weights of every type the GGUF reader supports: uniform values quantised row by row
// (rows padded and off alignment).
struct QuantizedWeights {
  std::vector<uint8_t> buffer;
  WeightView view;
};

QuantizedWeights RandomWeightsOfType(DType type, int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t row_bytes = RowBytes(type, k) + 3, offset = 1;
  QuantizedWeights w;
  w.buffer.assign(size_t(offset + n * row_bytes), 0xAB);
  std::vector<float> row(static_cast<size_t>(k));  // [K]
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = uniform(rng);
    QuantizeValues(type, row.data(), k, w.buffer.data() + offset + r * row_bytes);
  }
  w.view = WeightView{type, w.buffer.data() + offset, n, k, row_bytes};
  return w;
}

// Every kernel set this CPU runs, with both activation precisions (ops/isa.h).
std::vector<CpuBackend> EveryCpuBackend() {
  std::vector<CpuBackend> backends;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    for (ActivationPrecision activations :
         {ActivationPrecision::kReduced, ActivationPrecision::kF32}) {
      backends.emplace_back(isa, activations);
    }
  }
  return backends;
}

std::string BackendLabel(const CpuBackend& backend) {
  return Cat(backend.name(),
             backend.activations() == ActivationPrecision::kReduced ? " reduced" : " f32");
}

// Segment lists mixing dot-path and panel-path sizes of both kernel sets.
const std::vector<std::vector<int64_t>> kSegmentLists = {
    {1}, {3, 1, 7}, {6, 7, 2, 13, 1}, {8, 8, 8}, {2, 4, 3, 5, 1, 1}};

constexpr DType kGgufWeightTypes[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0,
                                      DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// K odd for the float types, an odd number of blocks for the block types.
int64_t OddWidthFor(DType type) {
  return BlockSize(type) == 1 ? 1001 : BlockSize(type) == 32 ? 7 * 32 : 3 * 256;
}

// The batched product of the segments' concatenation against each segment's product alone,
// bit for bit, with and without bias. Two threads and N = 301 (19 panels): the batch's
// columns split among threads where a short segment's stay on one.
TEST(CpuBackend, MatMulBatchGivesEverySegmentItsBitsAlone) {
  std::mt19937 rng(41);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int64_t n = 301;
  const std::vector<CpuBackend> backends = EveryCpuBackend();
  for (DType type : kGgufWeightTypes) {
    const int64_t k = OddWidthFor(type);
    const QuantizedWeights w = RandomWeightsOfType(type, n, k, rng);
    const auto bias = RandomVector(n, 1.0f, rng);
    for (const std::vector<int64_t>& segments : kSegmentLists) {
      int64_t m = 0;
      for (int64_t rows : segments) m += rows;
      const auto x = RandomVector(m * k, 1.0f, rng);  // [M, K] at x.data() + 1
      for (const CpuBackend& backend : backends) {
        if (!IsBlockQuantized(type) && type != DType::kBF16 &&
            backend.activations() == ActivationPrecision::kF32)
          continue;  // the precision is for block-quantised and BF16 weights only
        for (const float* b : {static_cast<const float*>(nullptr), bias.data() + 1}) {
          std::vector<float> batched(size_t(m * n)), alone(batched.size());  // [M, N]
          backend.MatMulBatch(x.data() + 1, segments, w.view, batched.data(), b);
          int64_t row = 0;
          for (int64_t rows : segments) {
            backend.MatMul(x.data() + 1 + row * k, rows, w.view, alone.data() + row * n, b);
            row += rows;
          }
          ASSERT_EQ(std::memcmp(batched.data(), alone.data(), batched.size() * 4), 0)
              << BackendLabel(backend) << " " << DTypeName(type) << " K=" << k
              << " segments=" << testing::PrintToString(segments) << (b ? " bias" : "");
        }
      }
    }
  }
  SetThreadCount(saved_threads);
}

// The same for the LM head: the normalised rows and the logits.
TEST(CpuBackend, LmHeadBatchGivesEverySegmentItsBitsAlone) {
  std::mt19937 rng(42);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int64_t vocab = 301;
  const std::vector<CpuBackend> backends = EveryCpuBackend();
  for (DType type : {DType::kF16, DType::kBF16, DType::kQ4_K, DType::kQ8_0}) {
    const int64_t c = OddWidthFor(type);
    const QuantizedWeights lm_head = RandomWeightsOfType(type, vocab, c, rng);
    const auto norm = RandomVector(c, 1.0f, rng);
    for (const std::vector<int64_t>& segments : kSegmentLists) {
      int64_t m = 0;
      for (int64_t rows : segments) m += rows;
      const auto x = RandomVector(m * c, 3.0f, rng);
      for (const CpuBackend& backend : backends) {
        std::vector<float> batched_x(x.begin() + 1, x.end()), alone_x = batched_x;  // [M, C]
        std::vector<float> batched(size_t(m * vocab)), alone(batched.size());       // [M, V]
        backend.LmHeadBatch(batched_x.data(), segments, c, norm.data() + 1, 1e-5f, lm_head.view,
                            batched.data());
        int64_t row = 0;
        for (int64_t rows : segments) {
          backend.LmHead(alone_x.data() + row * c, rows, c, norm.data() + 1, 1e-5f, lm_head.view,
                         alone.data() + row * vocab);
          row += rows;
        }
        const std::string label = Cat(BackendLabel(backend), " ", DTypeName(type),
                                      " segments=", testing::PrintToString(segments));
        ASSERT_EQ(batched_x, alone_x) << label;
        ASSERT_EQ(std::memcmp(batched.data(), alone.data(), batched.size() * 4), 0) << label;
      }
    }
  }
  SetThreadCount(saved_threads);
}

// SiluMul, RmsNorm and AddInPlace of a long batch of rows against each row alone, at every
// offset: on two threads the long vector is cut at a chunk boundary that is no multiple of
// the vector width, and a row alone has its own tail.
TEST(CpuBackend, RowOpsGiveEveryElementItsBitsWhereverItFalls) {
  std::mt19937 rng(43);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int64_t n = 10007, width = 13;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    const CpuBackend backend(isa);
    SCOPED_TRACE(std::string(backend.name()));
    const auto gate = RandomVector(n, 12.0f, rng), up = RandomVector(n, 2.0f, rng);
    std::vector<float> batched(gate.begin() + 1, gate.end());  // [n]
    backend.SiluMul(batched.data(), up.data() + 1, n);
    std::vector<float> sum(gate.begin() + 1, gate.end());  // [n]
    backend.AddInPlace(sum.data(), up.data() + 1, n);
    for (int64_t i = 0; i < n; ++i) {
      float alone = gate[size_t(i) + 1], alone_sum = alone;
      backend.SiluMul(&alone, up.data() + 1 + i, 1);
      backend.AddInPlace(&alone_sum, up.data() + 1 + i, 1);
      ASSERT_EQ(Bits(alone), Bits(batched[size_t(i)])) << "element " << i;
      ASSERT_EQ(Bits(alone_sum), Bits(sum[size_t(i)])) << "element " << i;
    }
    for (int64_t offset = 0; offset + width <= n; offset += 7) {  // rows at every offset mod 8
      std::vector<float> row(gate.begin() + 1 + offset, gate.begin() + 1 + offset + width);
      backend.SiluMul(row.data(), up.data() + 1 + offset, width);
      ASSERT_EQ(std::memcmp(row.data(), batched.data() + offset, width * 4), 0)
          << "row at " << offset;
    }

    const int64_t rows = n / width;
    const auto weight = RandomVector(width, 1.0f, rng);
    std::vector<float> normed(size_t(rows * width));  // [rows, width]
    backend.RmsNorm(gate.data() + 1, rows, width, weight.data() + 1, 1e-5f, normed.data());
    for (int64_t r = 0; r < rows; ++r) {
      float alone[width];
      backend.RmsNorm(gate.data() + 1 + r * width, 1, width, weight.data() + 1, 1e-5f, alone);
      ASSERT_EQ(std::memcmp(alone, normed.data() + r * width, sizeof(alone)), 0) << "row " << r;
    }
  }
  SetThreadCount(saved_threads);
}

// ---------------------------------------------------------------------------------------
// Greedy choices: what a logit row returns at temperature 0 in place of its logits

TEST(GreedyChoiceOf, TokensAndConfidencesOfHandMadeRows) {
  std::vector<float> probs(4);  // [V] scratch
  const std::vector<float> tied = {1.0f, 3.0f, 2.0f, 3.0f};
  const double total = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  GreedyChoice c = GreedyChoiceOf(tied, {GreedyConfidence::kFloat64Softmax, -1}, {});
  EXPECT_EQ(c.token, 1);  // ties: the first index
  EXPECT_NEAR(c.confidence, std::exp(3.0) / total, 1e-15);
  EXPECT_EQ(c.non_finite, 0.0f);
  c = GreedyChoiceOf(tied, {GreedyConfidence::kFloat64Softmax, 1}, {});
  EXPECT_EQ(c.token, 3);  // the excluded token is never chosen
  EXPECT_NEAR(c.confidence, std::exp(3.0) / total, 1e-15);
  c = GreedyChoiceOf(tied, {GreedyConfidence::kNone, 3}, {});
  EXPECT_EQ(c.token, 1);
  EXPECT_EQ(c.confidence, 0.0);

  // probabilities 0.1, 0.3, 0.6
  const std::vector<float> row = {0.0f, std::log(3.0f), std::log(6.0f)};
  const std::span<float> three(probs.data(), 3);
  c = GreedyChoiceOf(row, {GreedyConfidence::kFp32Probability, -1}, three);
  EXPECT_EQ(c.token, 2);
  EXPECT_NEAR(c.confidence, 0.6, 1e-6);
  c = GreedyChoiceOf(row, {GreedyConfidence::kFp32Probability, 2}, three);
  EXPECT_EQ(c.token, 1);
  EXPECT_NEAR(c.confidence, 0.3, 1e-6);
  c = GreedyChoiceOf(row, {GreedyConfidence::kFp32Margin, 2}, three);
  EXPECT_EQ(c.token, 1);
  EXPECT_NEAR(c.confidence, 0.3, 1e-6);  // top-1 minus top-2 over the whole row
  c = GreedyChoiceOf(row, {GreedyConfidence::kFp32NegEntropy, -1}, three);
  EXPECT_NEAR(c.confidence, 0.1 * std::log(0.1) + 0.3 * std::log(0.3) + 0.6 * std::log(0.6), 1e-5);

  // A row with a NaN or an infinity reports its first one, whatever the kind.
  const float inf = std::numeric_limits<float>::infinity();
  for (GreedyConfidence kind : {GreedyConfidence::kNone, GreedyConfidence::kFloat64Softmax,
                                GreedyConfidence::kFp32Probability, GreedyConfidence::kFp32Margin,
                                GreedyConfidence::kFp32NegEntropy}) {
    const std::vector<float> bad = {1.0f, -inf, std::nanf(""), 2.0f};
    EXPECT_EQ(GreedyChoiceOf(bad, {kind, -1}, probs).non_finite, -inf);
    const std::vector<float> nan_first = {std::nanf(""), inf, 0.0f, 2.0f};
    EXPECT_TRUE(std::isnan(GreedyChoiceOf(nan_first, {kind, -1}, probs).non_finite));
  }
}

// Every kernel set's GreedyChoices, threaded over rows (several chunks), against
// GreedyChoiceOf row by row, bit for bit, into poisoned outputs: rows with ties, with the
// excluded token on top, with NaN and infinities; vocabularies shrinking and growing between
// calls (the fp32 kinds' scratch is kept across calls).
TEST(CpuBackend, GreedyChoicesGiveEveryRowTheBitsOfGreedyChoiceOf) {
  std::mt19937 rng(44);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int64_t m = 37;
  const int excluded = 5;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    const CpuBackend backend(isa);
    for (int64_t vocab : {4099, 17, 4099}) {
      std::vector<float> logits = RandomVector(m * vocab, 8.0f, rng);  // [1 + M * V]
      float* rows = logits.data() + 1;                                 // off the alignment
      for (int64_t r = 0; r < m; ++r) {
        float* row = rows + r * vocab;
        const int64_t top = std::max_element(row, row + vocab) - row;
        if (r % 5 == 1) row[(top + 3) % vocab] = row[top];      // a tie
        if (r % 5 == 2) std::swap(row[top], row[excluded]);     // the excluded on top
        if (r % 7 == 3) row[(r * 31) % vocab] = std::nanf("");  // non-finite rows
        if (r % 7 == 4) row[(r * 13) % vocab] = -std::numeric_limits<float>::infinity();
      }
      for (GreedyConfidence kind :
           {GreedyConfidence::kNone, GreedyConfidence::kFloat64Softmax,
            GreedyConfidence::kFp32Probability, GreedyConfidence::kFp32Margin,
            GreedyConfidence::kFp32NegEntropy}) {
        SCOPED_TRACE(std::string(backend.name()) + " V=" + std::to_string(vocab) + " kind " +
                     std::to_string(int(kind)));
        const GreedySpec spec{kind, excluded};
        const GreedyChoice poison{-12345, 777.0f, std::numeric_limits<double>::quiet_NaN()};
        std::vector<GreedyChoice> got(size_t(m) + 1, poison);  // [M] and one past the end
        backend.GreedyChoices(rows, m, vocab, spec, got.data());
        std::vector<float> probs(static_cast<size_t>(vocab));  // [V]
        for (int64_t r = 0; r < m; ++r) {
          const GreedyChoice want = GreedyChoiceOf({rows + r * vocab, size_t(vocab)}, spec, probs);
          ASSERT_EQ(std::memcmp(&got[size_t(r)], &want, sizeof(GreedyChoice)), 0) << "row " << r;
          ASSERT_NE(got[size_t(r)].token, excluded);
        }
        EXPECT_EQ(std::memcmp(&got[size_t(m)], &poison, sizeof(GreedyChoice)), 0);
      }
    }
  }
  SetThreadCount(saved_threads);
}

}  // namespace
}  // namespace polestar

// ---------------------------------------------------------------------------------------
// Polestar's clustering and NVFP4 store over backend memory, against their scalar twins
// (drift/drift.h) and hand-computed values; every output starts poisoned.
namespace polestar {
namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kPoisonByte = 0xab;

std::vector<float> RandomRows(int64_t rows, int64_t width, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * width));  // [rows, width]
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(CpuBackend, SphericalKMeansHasItsTwinsBits) {
  const CpuBackend& backend = CpuBackend::Host();
  for (const auto& [n, d, k] : {std::tuple{40, 37, 3}, {7, 16, 2}, {3, 5, 4}, {50, 8, 1}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << d << " k " << k);
    const std::vector<float> points = RandomRows(n, d, unsigned(n * d + k));
    std::vector<float> centroids(size_t(k * d), kPoison);  // [k, d]
    std::vector<int> labels(size_t(n), -7);                // [n]
    backend.SphericalKMeans(points.data(), n, d, k, 5, centroids.data(), labels.data());
    const Clustering twin = SphericalKMeans(points, n, d, k, 5);
    for (size_t i = 0; i < centroids.size(); ++i)
      ASSERT_EQ(Bits(centroids[i]), Bits(twin.centroids[i])) << i;
    EXPECT_EQ(labels, twin.labels);
    for (int label : labels) EXPECT_TRUE(label >= 0 && label < k);
  }
}

// Pairs (now row, before row, cluster): cluster 0 gets two pairs, cluster 2 one, cluster 1
// none, cluster 3 one but no members. Each moved centroid gains sum(now - before) / members.
TEST(CpuBackend, ShiftCentroidsMovesTheNamedClustersByTheirMeanChange) {
  const CpuBackend& backend = CpuBackend::Host();
  constexpr int64_t kWidth = 3;
  const std::vector<float> now = {1, 2, 3, 10, 20, 30, 0.5f, 0.25f, 4, 7, 7, 7};  // [4, 3]
  const std::vector<float> before = {0, 0, 1, 1, 1, 1, 2, 4, 8, 6, 6, 6};         // [4, 3]
  const std::vector<int> now_rows = {1, 0, 2, 3}, labels = {0, 2, 0, 3};
  const std::vector<float> members = {4, 2, 1, 0};
  std::vector<float> centroids = {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4};  // [4, 3]
  const std::vector<float> start = centroids;
  backend.ShiftCentroids(now.data(), now_rows, before.data(), labels, members, kWidth,
                         centroids.data());
  for (int64_t j = 0; j < kWidth; ++j) {
    // Cluster 0: pairs (now 1, before 0) and (now 2, before 2).
    const double shift0 = (double(now[size_t(3 + j)]) - before[size_t(j)]) +
                          (double(now[size_t(6 + j)]) - before[size_t(6 + j)]);
    EXPECT_EQ(centroids[size_t(j)], start[size_t(j)] + float(shift0 / (4 + 1e-6)));
    EXPECT_EQ(centroids[size_t(3 + j)], start[size_t(3 + j)]);  // no pair
    const double shift2 = double(now[size_t(j)]) - before[size_t(3 + j)];
    EXPECT_EQ(centroids[size_t(6 + j)], start[size_t(6 + j)] + float(shift2 / (1 + 1e-6)));
    EXPECT_EQ(centroids[size_t(9 + j)], start[size_t(9 + j)]);  // no members
  }
  EXPECT_NEAR(centroids[0], 1 + (10.0 - 0 + 0.5 - 2) / 4, 1e-5);
}

TEST(CpuBackend, ResidualAbsMaxIsTheLargestDistanceFromTheRowsBases) {
  const CpuBackend& backend = CpuBackend::Host();
  const std::vector<float> x = {1, -2, 5, 0, 3, 3, 100, -100};  // [4, 2]; row 3 not named
  const std::vector<float> base = {0, 0, 4, -4};                // [2, 2]
  float amax = kPoison;
  backend.ResidualAbsMax(x.data(), std::vector<int>{0, 1, 2}, base.data(),
                         std::vector<int>{1, 0, 1}, 2, &amax);
  // |1 - 4|, |-2 + 4|, |5 - 0|, |0 - 0|, |3 - 4|, |3 + 4|: 7.
  EXPECT_EQ(amax, 7.0f);
}

// The store's rows are NVFP4 of each row's residual from its base row; reading them back
// adds the base again. Rows the ops do not name keep their bytes.
TEST(CpuBackend, Nvfp4ResidualsHaveTheirTwinsBits) {
  const CpuBackend& backend = CpuBackend::Host();
  for (const int64_t width : {int64_t(16), int64_t(37), int64_t(64)}) {
    SCOPED_TRACE(width);
    const int64_t scale_bytes = Nvfp4ScaleBytes(width), value_bytes = Nvfp4ValueBytes(width);
    const std::vector<float> x = RandomRows(5, width, unsigned(width));         // [5, width]
    const std::vector<float> base = RandomRows(2, width, unsigned(width) + 1);  // [2, width]
    const std::vector<int> x_rows = {4, 0, 2}, labels = {1, 0, 1}, store_rows = {3, 0, 1};
    float amax = kPoison;
    backend.ResidualAbsMax(x.data(), x_rows, base.data(), labels, width, &amax);
    const float tensor_scale = Nvfp4TensorScale(amax);
    std::vector<uint8_t> scales(size_t(5 * scale_bytes), kPoisonByte);  // [5 rows, ...]
    std::vector<uint8_t> values(size_t(5 * value_bytes), kPoisonByte);
    backend.QuantizeResiduals(x.data(), x_rows, base.data(), labels, width, tensor_scale,
                              scales.data(), values.data(), store_rows);
    std::vector<float> residual(static_cast<size_t>(width));  // [width]
    std::vector<uint8_t> want_scales(static_cast<size_t>(scale_bytes)),
        want_values(static_cast<size_t>(value_bytes));
    for (size_t i = 0; i < x_rows.size(); ++i) {
      for (int64_t j = 0; j < width; ++j) {
        residual[size_t(j)] =
            x[size_t(x_rows[i] * width + j)] - base[size_t(labels[i] * width + j)];
      }
      QuantizeNvfp4(residual.data(), width, tensor_scale, want_scales.data(), want_values.data());
      const int64_t r = store_rows[i];
      EXPECT_TRUE(
          std::equal(want_scales.begin(), want_scales.end(), scales.begin() + r * scale_bytes));
      EXPECT_TRUE(
          std::equal(want_values.begin(), want_values.end(), values.begin() + r * value_bytes));
    }
    for (int64_t r : {2, 4}) {  // not stored
      for (int64_t b = 0; b < scale_bytes; ++b)
        EXPECT_EQ(scales[size_t(r * scale_bytes + b)], kPoisonByte);
      for (int64_t b = 0; b < value_bytes; ++b)
        EXPECT_EQ(values[size_t(r * value_bytes + b)], kPoisonByte);
    }

    // Store rows 1 and 3 into out rows 2 and 0; out row 1 stays as it was.
    std::vector<float> out(size_t(3 * width), kPoison);  // [3, width]
    const std::vector<int> read_rows = {1, 3}, read_labels = {1, 1}, out_rows = {2, 0};
    backend.DequantizeResiduals(scales.data(), values.data(), read_rows, base.data(), read_labels,
                                width, tensor_scale, out.data(), out_rows);
    std::vector<float> want(static_cast<size_t>(width));  // [width]
    for (size_t i = 0; i < read_rows.size(); ++i) {
      DequantizeNvfp4(scales.data() + read_rows[i] * scale_bytes,
                      values.data() + read_rows[i] * value_bytes, width, tensor_scale, want.data());
      for (int64_t j = 0; j < width; ++j) {
        const float expected = want[size_t(j)] + base[size_t(read_labels[i] * width + j)];
        ASSERT_EQ(Bits(out[size_t(out_rows[i] * width + j)]), Bits(expected)) << i << " " << j;
        // Close to the row it stored (x row 4, stored at row 3; x row 2 at row 1): within
        // half the widest E2M1 gap (1) of a block scale of at most about amax / 6.
        const int64_t x_row = read_rows[i] == 3 ? 4 : 2;
        EXPECT_NEAR(out[size_t(out_rows[i] * width + j)], x[size_t(x_row * width + j)],
                    0.2f * amax);
      }
    }
    for (int64_t j = 0; j < width; ++j) EXPECT_TRUE(std::isnan(out[size_t(width + j)]));
  }
}

}  // namespace
}  // namespace polestar
