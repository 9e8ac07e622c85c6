// BF16 products (ops/bf16_matmul.h): the rounding by hand, the scalar twin's additions by
// hand (their order and flushing included), the AVX512_BF16 kernels against the twin bit for
// bit, and the error against fp32 activations within the stated bound.
#include "ops/bf16_matmul.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "base/dtype.h"
#include "base/parallel.h"
#include "ops/isa.h"
#include "ops/reference.h"

namespace polestar {
namespace {

float Bits(uint32_t bits) { return std::bit_cast<float>(bits); }

// BF16 weights [N, K] from their 16-bit patterns, rows `pad` bytes longer than needed and
// the first one at an odd address, so no load may assume alignment.
struct Bf16Weights {
  std::vector<uint8_t> buffer;
  WeightView view;
};

Bf16Weights WeightsOf(const std::vector<uint16_t>& values, int64_t n, int64_t k, int64_t pad = 6) {
  Bf16Weights w;
  const int64_t row_bytes = 2 * k + pad, offset = 1;
  w.buffer.assign(size_t(offset + n * row_bytes), 0xEE);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(w.buffer.data() + offset + r * row_bytes, values.data() + r * k, size_t(2 * k));
  }
  w.view = WeightView{DType::kBF16, w.buffer.data() + offset, n, k, row_bytes};
  return w;
}

Bf16Weights RandomWeights(int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<uint16_t> values(size_t(n * k));  // [N, K]
  for (uint16_t& v : values) v = RoundToBf16(uniform(rng));
  return WeightsOf(values, n, k);
}

std::vector<float> RandomValues(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = uniform(rng);
  return v;
}

TEST(Bf16Rounding, RoundsToNearestEvenAndFlushesSubnormals) {
  EXPECT_EQ(RoundToBf16(1.0f), 0x3f80);
  EXPECT_EQ(RoundToBf16(-2.0f), 0xc000);
  EXPECT_EQ(RoundToBf16(Bits(0x3f808000)), 0x3f80);  // halfway: to the even 0x3f80
  EXPECT_EQ(RoundToBf16(Bits(0x3f818000)), 0x3f82);  // halfway: to the even 0x3f82
  EXPECT_EQ(RoundToBf16(Bits(0x3f808001)), 0x3f81);  // past halfway: up
  EXPECT_EQ(RoundToBf16(Bits(0x3f807fff)), 0x3f80);  // below halfway: down
  EXPECT_EQ(RoundToBf16(1e-40f), 0x0000);            // subnormal: flushed
  EXPECT_EQ(RoundToBf16(-1e-40f), 0x8000);
  EXPECT_EQ(RoundToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(RoundToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(RoundToBf16(Bits(0x7f800001)), 0x7fc0);  // a signalling NaN comes back quiet
  EXPECT_EQ(RoundToBf16(Bits(0xffc12345)), 0xffc1);
}

TEST(Bf16Rounding, WordsHoldPairsAndTheOddTailIsZero) {
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, 4.0f};  // [2, 3]
  Bf16Activations rounded;
  RoundToBf16(x.data(), 2, 3, &rounded);
  EXPECT_EQ(rounded.pairs, 2);
  EXPECT_EQ(rounded.words,
            (std::vector<uint32_t>{0xc0003f80u, 0x00003f00u, 0x3e804040u, 0x00004080u}));
}

TEST(Bf16Rounding, SimdGivesTheScalarWords) {
  if (!Avx512Bf16Supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(7);
  for (int64_t k : {1, 15, 16, 17, 33, 258}) {
    std::vector<float> x = RandomValues(3 * k, rng);  // [3, K]
    const float special[] = {1e-40f,
                             -1e-40f,
                             Bits(0x3f808000),
                             Bits(0x3f818000),
                             std::numeric_limits<float>::max(),
                             Bits(0x7f800001),
                             -std::numeric_limits<float>::infinity(),
                             Bits(0xffc12345)};
    for (size_t i = 0; i < x.size(); i += 3) x[i] = special[(i / 3) % 8];
    Bf16Activations scalar, simd;
    RoundToBf16(x.data(), 3, k, &scalar);
    simd.words.assign(99, 0xdeadbeef);  // stale memory must not leak into the odd tail
    avx512::RoundToBf16(x.data(), 3, k, &simd);
    EXPECT_EQ(simd.words, scalar.words) << "K=" << k;
  }
}

// The scalar twin makes vdpbf16ps's additions one by one: each pair's odd product first.
// K = 4, weights (1, 0, -1, 2^-24) against x = 1: pair 0 gives 1; pair 1 adds 2^-24 first
// (1 + 2^-24 is halfway, so back to 1), then -1: 0. The other order would end at 2^-24.
TEST(Bf16Dot, AddsTheOddProductOfEachPairFirst) {
  const Bf16Weights w = WeightsOf({0x3f80, 0x0000, 0xbf80, 0x3380}, 1, 4);
  const std::vector<float> ones = {1, 1, 1, 1};
  Bf16Activations x;
  RoundToBf16(ones.data(), 1, 4, &x);
  float y = -1;
  Bf16DotColumns(x, w.view, 0, 1, &y, 1);
  EXPECT_EQ(y, 0.0f);
  if (Avx512Bf16Supported()) {
    float simd = -1;
    avx512::Bf16DotColumns(x, w.view, 0, 1, &simd, 1);
    EXPECT_EQ(simd, 0.0f) << "the hardware adds the even product first";
  }
}

TEST(Bf16Dot, HandComputedSumsAndFlushedProducts) {
  // Weights [2, 3] (K = 3: the last pair's high half is 0): (0.5, 0.25, -1), (2^-100, 0, 0).
  const Bf16Weights w = WeightsOf({0x3f00, 0x3e80, 0xbf80, 0x0d80, 0x0000, 0x0000}, 2, 3);
  const std::vector<float> xs = {1, 2, 3, 0x1p-40f, 5, 1};  // [2, 3]
  Bf16Activations x;
  RoundToBf16(xs.data(), 2, 3, &x);
  std::vector<float> y(4, -1);  // [2, 2]
  Bf16DotColumns(x, w.view, 0, 2, y.data(), 2);
  EXPECT_EQ(y[0], -2.0f);      // 2 * 0.25 + 1 * 0.5 - 3
  EXPECT_EQ(y[1], 0x1p-100f);  // 1 * 2^-100, a normal float
  EXPECT_EQ(y[2], 0.25f);      // 5 * 0.25 + 2^-41 (lost beside 1.25) - 1
  EXPECT_EQ(y[3], 0.0f);       // 2^-40 * 2^-100 = 2^-140 is below FLT_MIN: flushed
  EXPECT_FALSE(std::signbit(y[3]));
  if (Avx512Bf16Supported()) {
    std::vector<float> simd(4, -1);  // [2, 2]
    avx512::Bf16DotColumns(x, w.view, 0, 2, simd.data(), 2);
    EXPECT_EQ(simd, y);
  }
}

// The AVX512_BF16 kernel against the scalar twin, bit for bit: odd K and N, panels cut at
// every place, tiles of every row count, a column range that does not start at 0.
TEST(Bf16Dot, SimdKernelGivesTheScalarTwinsBits) {
  if (!Avx512Bf16Supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(11);
  for (int64_t k : {1, 2, 7, 8, 9, 256, 257, 300, 1001}) {
    for (int64_t n : {1, 17, 32, 33, 70}) {
      const Bf16Weights w = RandomWeights(n, k, rng);
      for (int64_t m : {1, 2, 5, 12, 13, 25, 61}) {
        const std::vector<float> xs = RandomValues(m * k, rng);
        Bf16Activations x;
        RoundToBf16(xs.data(), m, k, &x);
        const int64_t n_begin = n > 3 ? 3 : 0, ldy = n + 5;
        std::vector<float> scalar(size_t(m * ldy), 7.0f), simd(scalar);  // [M, ldy]
        Bf16DotColumns(x, w.view, n_begin, n, scalar.data(), ldy);
        avx512::Bf16DotColumns(x, w.view, n_begin, n, simd.data(), ldy);
        ASSERT_EQ(std::memcmp(scalar.data(), simd.data(), scalar.size() * 4), 0)
            << "M=" << m << " K=" << k << " N=" << n;
      }
    }
  }
}

// Against fp32 activations times the same weights: within 2^-9 sum |w x| (the rounding of
// the activations) plus K 2^-24 sum |w x| (float additions), as ops/bf16_matmul.h states;
// and the rounding does show, or the test would not be testing the BF16 path.
TEST(Bf16MatMul, ErrorAgainstFp32ActivationsIsWithinTheBound) {
  if (!Avx512Bf16Supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937 rng(13);
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  const int64_t m = 20, k = 515, n = 97;
  const Bf16Weights w = RandomWeights(n, k, rng);
  const std::vector<float> x = RandomValues(m * k, rng), bias = RandomValues(n, rng);
  std::vector<float> got(size_t(m * n)), want(got.size());  // [M, N]
  ASSERT_TRUE(Bf16MatMul(x.data(), m, w.view, got.data(), bias.data()));
  reference::MatMulColumns(x.data(), m, w.view, 0, n, want.data(), n);
  std::vector<float> widened(static_cast<size_t>(k));  // [K]
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    reference::DequantizeRow(w.view, j, widened.data());
    for (int64_t i = 0; i < m; ++i) {
      double magnitude = 0;
      for (int64_t c = 0; c < k; ++c) magnitude += std::fabs(double(widened[c]) * x[i * k + c]);
      const double error = std::fabs(double(got[i * n + j]) - bias[j] - want[i * n + j]);
      EXPECT_LE(error, (0x1p-9 + double(k) * 0x1p-24) * magnitude + 1e-6) << i << " " << j;
      worst = std::max(worst, error / magnitude);
    }
  }
  EXPECT_GT(worst, 1e-5);
  SetThreadCount(saved_threads);
  // Other weight types are not this product's.
  const std::vector<float> f32_weights(size_t(k), 1.0f);
  const WeightView f32{DType::kF32, reinterpret_cast<const uint8_t*>(f32_weights.data()), 1, k,
                       4 * k};
  EXPECT_FALSE(Bf16MatMul(x.data(), 1, f32, got.data(), nullptr));
}

TEST(Bf16MatMul, BackendUsesItOnlyForReducedPrecision) {
  if (!Avx512Bf16Supported()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  EXPECT_TRUE(CpuBackend(Isa::kAvx512, ActivationPrecision::kReduced).bf16_products());
  EXPECT_FALSE(CpuBackend(Isa::kAvx512, ActivationPrecision::kF32).bf16_products());
  EXPECT_FALSE(CpuBackend(Isa::kAvx2, ActivationPrecision::kReduced).bf16_products());
  std::mt19937 rng(17);
  const int64_t m = 9, k = 64, n = 40;
  const Bf16Weights w = RandomWeights(n, k, rng);
  const std::vector<float> xs = RandomValues(m * k, rng);
  Bf16Activations x;
  RoundToBf16(xs.data(), m, k, &x);
  std::vector<float> twin(size_t(m * n)), got(twin.size());  // [M, N]
  Bf16DotColumns(x, w.view, 0, n, twin.data(), n);
  CpuBackend(Isa::kAvx512, ActivationPrecision::kReduced).MatMul(xs.data(), m, w.view, got.data());
  EXPECT_EQ(got, twin);
}

}  // namespace
}  // namespace polestar
