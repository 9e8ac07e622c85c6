// Block-quantised weight formats: dequantisation against values worked out by hand from the
// format definitions, the quantisers against hand-computed cases and error bounds, and the
// integer matrix products: the activation quantiser by hand and SIMD against scalar, the SIMD
// kernels against their scalar twins, and the error against fp32 activations within the
// bound ops/quant.h states.
#include "ops/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/parallel.h"
#include "ops/avx2/avx2.h"
#include "ops/isa.h"
#include "ops/reference.h"

namespace polestar {
namespace {

void PutF16(uint8_t* p, float value) {
  const uint16_t bits = F32ToF16(value);
  std::memcpy(p, &bits, 2);
}

std::vector<float> Dequantize(DType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  DequantizeValues(type, bytes.data(), n, out.data());
  return out;
}

// Packs 6-bit scales and mins of 8 sub-blocks into K-quant scales[12]: bytes 0-3 hold
// scales 0-3, bytes 4-7 mins 0-3, bytes 8-11 the low nibbles of scale/min 4-7; the high two
// bits of scale/min 4-7 sit in the top bits of bytes 0-3 / 4-7.
void PackScalesK(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

constexpr int kSubScales[8] = {1, 2, 3, 63, 17, 33, 48, 60};
constexpr int kSubMins[8] = {0, 5, 63, 7, 18, 40, 2, 59};

TEST(BlockFormat, Q8_0ByHand) {
  std::vector<uint8_t> block(34);
  PutF16(block.data(), 0.5f);
  for (int j = 0; j < 32; ++j) block[2 + j] = uint8_t(int8_t(j - 16));
  const std::vector<float> y = Dequantize(DType::kQ8_0, block, 32);
  EXPECT_EQ(y[0], -8.0f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 7.5f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.5f) << j;
}

TEST(BlockFormat, Q4_0ByHand) {
  std::vector<uint8_t> block(18);
  PutF16(block.data(), 2.0f);
  for (int j = 0; j < 16; ++j) block[2 + j] = uint8_t(j | ((15 - j) << 4));
  const std::vector<float> y = Dequantize(DType::kQ4_0, block, 32);
  EXPECT_EQ(y[0], -16.0f);   // low nibble 0 -> (0 - 8) * 2
  EXPECT_EQ(y[15], 14.0f);   // low nibble 15
  EXPECT_EQ(y[16], 14.0f);   // high nibble of byte 0 is 15
  EXPECT_EQ(y[31], -16.0f);  // high nibble of byte 15 is 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 2.0f);
    EXPECT_EQ(y[j + 16], (7 - j) * 2.0f);
  }
}

TEST(BlockFormat, Q4_KByHand) {
  std::vector<uint8_t> block(144);
  PutF16(block.data(), 0.25f);       // d
  PutF16(block.data() + 2, 0.125f);  // dmin
  PackScalesK(kSubScales, kSubMins, block.data() + 4);
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 7) % 16;
  // 64 values per 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high nibbles.
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l)
      block[16 + 32 * c + l] = uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
  const std::vector<float> y = Dequantize(DType::kQ4_K, block, 256);
  EXPECT_EQ(y[1], 1.75f);      // 0.25 * 1 * 7
  EXPECT_EQ(y[96], -0.875f);   // sub-block 3: q 0, min 0.125 * 7
  EXPECT_EQ(y[97], 109.375f);  // 0.25 * 63 * 7 - 0.875
  EXPECT_EQ(y[224], -7.375f);  // sub-block 7: q 0, min 0.125 * 59
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    EXPECT_EQ(y[i], 0.25 * kSubScales[j] * q[i] - 0.125 * kSubMins[j]) << i;
  }
}

TEST(BlockFormat, Q5_KByHand) {
  std::vector<uint8_t> block(176);
  PutF16(block.data(), 0.25f);
  PutF16(block.data() + 2, 0.125f);
  PackScalesK(kSubScales, kSubMins, block.data() + 4);
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 11) % 32;
  // qh[l] bit 2c is the fifth bit of value 64c + l, bit 2c + 1 that of value 64c + 32 + l.
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      block[48 + 32 * c + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
      block[16 + l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
  const std::vector<float> y = Dequantize(DType::kQ5_K, block, 256);
  EXPECT_EQ(y[2], 5.5f);      // q = 22 (fifth bit set): 0.25 * 1 * 22
  EXPECT_EQ(y[3], 0.25f);     // q = 33 % 32 = 1
  EXPECT_EQ(y[40], 11.375f);  // sub-block 1, q = 440 % 32 = 24: 0.25 * 2 * 24 - 0.125 * 5
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    EXPECT_EQ(y[i], 0.25 * kSubScales[j] * q[i] - 0.125 * kSubMins[j]) << i;
  }
}

TEST(BlockFormat, Q6_KByHand) {
  std::vector<uint8_t> block(210);
  const int8_t scales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 127, -128};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 5) % 64;
  // Per 128 values: ql[l] = q[l] | q[l+64] << 4, ql[l+32] = q[l+32] | q[l+96] << 4 (low
  // nibbles), qh[l] = the high two bits of q[l], q[l+32], q[l+64], q[l+96].
  for (int h = 0; h < 2; ++h) {
    const int* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      block[64 * h + l] = uint8_t((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
      block[64 * h + l + 32] = uint8_t((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
      block[128 + 32 * h + l] = uint8_t((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                        ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
    }
  }
  std::memcpy(block.data() + 192, scales, 16);
  PutF16(block.data() + 208, 0.5f);
  const std::vector<float> y = Dequantize(DType::kQ6_K, block, 256);
  EXPECT_EQ(y[0], -16.0f);      // 0.5 * 1 * (0 - 32)
  EXPECT_EQ(y[16], 16.0f);      // 0.5 * -2 * (80 % 64 - 32)
  EXPECT_EQ(y[255], -1728.0f);  // 0.5 * -128 * (1275 % 64 - 32)
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.5 * scales[i / 16] * (q[i] - 32)) << i;
}

TEST(Quantizer, Q8_0ByHand) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16);
  std::vector<uint8_t> block(34);
  QuantizeValues(DType::kQ8_0, x.data(), 32, block.data());
  uint16_t d;
  std::memcpy(&d, block.data(), 2);
  EXPECT_EQ(d, F32ToF16(16.0f / 127));  // d = max|x| / 127
  EXPECT_EQ(int8_t(block[2 + 0]), -127);
  EXPECT_EQ(int8_t(block[2 + 16]), 0);
  EXPECT_EQ(int8_t(block[2 + 17]), 8);    // round(1 * 127 / 16) = round(7.94)
  EXPECT_EQ(int8_t(block[2 + 18]), 16);   // round(15.875)
  EXPECT_EQ(int8_t(block[2 + 31]), 119);  // round(119.06)
}

TEST(Quantizer, Q4_0ByHand) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16);
  std::vector<uint8_t> block(18);
  QuantizeValues(DType::kQ4_0, x.data(), 32, block.data());
  uint16_t d;
  std::memcpy(&d, block.data(), 2);
  EXPECT_EQ(d, F32ToF16(2.0f));  // the largest-magnitude value -16 maps to level 0: d = -16 / -8
  // level = trunc(x / 2 + 8.5), clamped to 15.
  EXPECT_EQ(block[2 + 0] & 0xF, 0);
  EXPECT_EQ(block[2 + 1] & 0xF, 1);   // -15 / 2 + 8.5 = 1.0
  EXPECT_EQ(block[2 + 2] & 0xF, 1);   // 1.5
  EXPECT_EQ(block[2 + 3] & 0xF, 2);   // 2.0
  EXPECT_EQ(block[2 + 15] >> 4, 15);  // x = 15: 16.0 clamps to 15
}

TEST(Quantizer, HalfPrecisionRounding) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(0.1f), 0x2e66);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                      // rounds up to infinity
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: zero
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  auto bf16 = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return F32ToBf16(f);
  };
  EXPECT_EQ(bf16(0x3f808000), 0x3f80);  // tie to even (down)
  EXPECT_EQ(bf16(0x3f818000), 0x3f82);  // tie to even (up)
  EXPECT_EQ(bf16(0x3f808001), 0x3f81);
}

std::vector<float> Gaussian(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Round trip of Gaussian data: the RMS error relative to the data's RMS lies within 15% above
// what the quantisers gave when written (Q8_0 0.0053, Q4_0 0.086, Q4_K 0.071, Q5_K 0.036,
// Q6_K 0.018, F16 0.00021, BF16 0.0016), and not implausibly below it.
TEST(Quantizer, RoundTripErrorBounds) {
  const struct {
    DType type;
    double max_relative_rms;
  } cases[] = {{DType::kQ8_0, 0.0061}, {DType::kQ4_0, 0.099},  {DType::kQ4_K, 0.082},
               {DType::kQ5_K, 0.041},  {DType::kQ6_K, 0.0205}, {DType::kF16, 0.00025},
               {DType::kBF16, 0.0019}};
  const int64_t n = 256 * 64;
  const std::vector<float> x = Gaussian(n, 7, 0.02f);
  for (const auto& c : cases) {
    std::vector<uint8_t> bytes(static_cast<size_t>(RowBytes(c.type, n)));
    QuantizeValues(c.type, x.data(), n, bytes.data());
    const std::vector<float> y = Dequantize(c.type, bytes, n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += double(y[i] - x[i]) * (y[i] - x[i]);
      ref += double(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(err / ref), c.max_relative_rms) << DTypeName(c.type);
    EXPECT_GT(std::sqrt(err / ref), c.max_relative_rms / 2) << DTypeName(c.type);
  }
}

TEST(Quantizer, ZeroBlocksStayZero) {
  const std::vector<float> zeros(256, 0.0f);
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    std::vector<uint8_t> bytes(static_cast<size_t>(RowBytes(type, 256)));
    QuantizeValues(type, zeros.data(), 256, bytes.data());
    for (float y : Dequantize(type, bytes, 256)) EXPECT_EQ(y, 0.0f) << DTypeName(type);
  }
}

constexpr DType kBlockTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                                 DType::kQ6_K};

// Random bytes in every field, with the f16 scales set to finite values.
std::vector<uint8_t> RandomBlocks(DType type, int64_t blocks, std::mt19937& rng) {
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks * BlockBytes(type)));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (uint8_t& b : bytes) b = uint8_t(byte(rng));
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = bytes.data() + b * BlockBytes(type);
    switch (type) {
      case DType::kQ4_K:
      case DType::kQ5_K:
        PutF16(block + 2, scale(rng));
        [[fallthrough]];
      case DType::kQ8_0:
      case DType::kQ4_0:
        PutF16(block, scale(rng));
        break;
      case DType::kQ6_K:
        PutF16(block + 208, scale(rng));
        break;
      default:
        break;
    }
  }
  return bytes;
}

TEST(Avx2Kernels, DequantizeMatchesScalarBitForBit) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(1);
  for (DType type : kBlockTypes) {
    for (int64_t blocks : {1, 2, 3, 8, 17}) {
      const std::vector<uint8_t> bytes = RandomBlocks(type, blocks, rng);
      const int64_t n = blocks * BlockSize(type);
      std::vector<float> scalar(static_cast<size_t>(n)), simd(static_cast<size_t>(n));
      DequantizeValues(type, bytes.data(), n, scalar.data());
      avx2::DequantizeValues(type, bytes.data(), n, simd.data());
      EXPECT_EQ(std::memcmp(scalar.data(), simd.data(), size_t(n) * 4), 0)
          << DTypeName(type) << " x " << blocks;
    }
  }
}

TEST(Avx2Kernels, MatMulMatchesScalar) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(2);
  for (DType type : kBlockTypes) {
    const std::vector<int64_t> widths =
        BlockSize(type) == 32 ? std::vector<int64_t>{32, 96, 256} : std::vector<int64_t>{256, 512};
    for (int64_t k : widths) {
      for (int64_t n : {1, 2, 3, 7, 8, 9, 17}) {
        const std::vector<uint8_t> bytes = RandomBlocks(type, n * k / BlockSize(type), rng);
        const WeightView w{type, bytes.data(), n, k, RowBytes(type, k)};
        for (int64_t m : {1, 2, 3, 4, 5, 8, 13}) {
          const std::vector<float> x = Gaussian(m * k, uint32_t(m * 131 + n * 7 + k));
          std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
          reference::MatMulColumns(x.data(), m, w, 0, n, want.data(), n);
          // Columns [1, n) through the kernel's offset output, column 0 on its own.
          avx2::QuantMatMulColumns(x.data(), m, w, 0, 1, got.data(), n);
          if (n > 1) avx2::QuantMatMulColumns(x.data(), m, w, 1, n, got.data() + 1, n);
          std::vector<float> row(static_cast<size_t>(k));
          for (int64_t c = 0; c < n; ++c) {
            DequantizeValues(type, w.Row(c), k, row.data());
            for (int64_t i = 0; i < m; ++i) {
              double magnitude = 0;
              for (int64_t j = 0; j < k; ++j) magnitude += std::fabs(x[i * k + j] * row[j]);
              EXPECT_NEAR(got[i * n + c], want[i * n + c], 1e-6 * magnitude + 1e-30)
                  << DTypeName(type) << " m=" << m << " n=" << n << " k=" << k;
            }
          }
        }
      }
    }
  }
}

// The driver on every kernel set this CPU runs, in both activation modes: with fp32
// activations within rounding of the reference, with int8 activations exactly the kernel's
// own products plus the bias (however the columns were split among threads).
TEST(QuantMatMul, EveryKernelSetAndActivationModeAddsTheBiasToItsKernel) {
  std::mt19937 rng(3);
  const int64_t m = 6, n = 300, k = 512;
  const std::vector<uint8_t> bytes = RandomBlocks(DType::kQ4_K, n * k / 256, rng);
  const WeightView w{DType::kQ4_K, bytes.data(), n, k, RowBytes(DType::kQ4_K, k)};
  const std::vector<float> x = Gaussian(m * k, 5), bias = Gaussian(n, 6);
  std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
  reference::MatMulColumns(x.data(), m, w, 0, n, want.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < n; ++c) want[i * n + c] += bias[c];
  }
  const int saved_threads = ThreadCount();
  SetThreadCount(2);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    SCOPED_TRACE(std::string(IsaName(isa)));
    ASSERT_TRUE(
        QuantMatMul(x.data(), m, w, got.data(), bias.data(), isa, ActivationPrecision::kF32));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i])));

    QuantizedActivations xq;
    QuantizeActivations(x.data(), m, k, ActivationBlock(w.dtype), &xq);
    std::vector<float> kernel(want.size());
    (isa == Isa::kAvx512 ? avx512::QuantDotColumns
     : isa == Isa::kAvx2 ? avx2::QuantDotColumns
                         : QuantDotColumns)(xq, w, 0, n, kernel.data(), n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < n; ++c) kernel[i * n + c] += bias[c];
    }
    ASSERT_TRUE(
        QuantMatMul(x.data(), m, w, got.data(), bias.data(), isa, ActivationPrecision::kReduced));
    EXPECT_EQ(got, kernel);
  }
  SetThreadCount(saved_threads);
  const WeightView f32{DType::kF32, bytes.data(), 1, 32, 128};
  EXPECT_FALSE(
      QuantMatMul(x.data(), 1, f32, got.data(), nullptr, BestIsa(), ActivationPrecision::kReduced));
}

// --- activations rounded to 8 bits ---

using Quantizer = void (*)(const float*, int64_t, int64_t, int, QuantizedActivations*);

std::vector<Quantizer> Quantizers() {
  std::vector<Quantizer> quantizers = {QuantizeActivations};
  if (IsaSupported(Isa::kAvx2)) quantizers.push_back(avx2::QuantizeActivations);
  return quantizers;
}

TEST(ActivationQuantizer, ByHand) {
  for (int block : {32, 256}) {
    // max|x| = 127: the inverse scale is exactly 1, so the levels are x rounded half to even.
    std::vector<float> x(static_cast<size_t>(block), 0.0f);
    const float head[] = {127.0f, 2.5f, 3.5f, -2.5f, -127.0f, 0.49f, -0.5f, 1.5f};
    std::copy(std::begin(head), std::end(head), x.begin());
    x[20] = 100.25f;
    for (Quantizer quantize : Quantizers()) {
      QuantizedActivations q;
      quantize(x.data(), 1, block, block, &q);
      ASSERT_EQ(q.scales.size(), 1u);
      EXPECT_EQ(q.scales[0], 1.0f);
      const int8_t want[] = {127, 2, 4, -2, -127, 0, 0, 2};
      for (int j = 0; j < 8; ++j) EXPECT_EQ(q.q[size_t(j)], want[j]) << j;
      EXPECT_EQ(q.q[20], 100);
      EXPECT_EQ(q.group_sums[0], 127 + 2 + 4 - 2 - 127 + 2);
      EXPECT_EQ(q.group_sums[1], 100);
      for (size_t g = 2; g < q.group_sums.size(); ++g) EXPECT_EQ(q.group_sums[g], 0);
    }
  }
  // max|x| = 16: d = 16 / 127, levels x * 7.9375 rounded: 8 * 7.9375 = 63.5 -> 64 (even).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j - 16);
  x[1] = 8.0f;
  for (Quantizer quantize : Quantizers()) {
    QuantizedActivations q;
    quantize(x.data(), 1, 32, 32, &q);
    EXPECT_EQ(q.scales[0], 16.0f / 127);
    EXPECT_EQ(q.q[0], -127);
    EXPECT_EQ(q.q[1], 64);
    EXPECT_EQ(q.q[17], 8);    // 7.9375
    EXPECT_EQ(q.q[31], 119);  // 119.0625
  }
}

TEST(ActivationQuantizer, ZeroBlocksAreZero) {
  std::vector<float> x(2 * 256, 0.0f);
  x[300] = -3.0f;  // the second row is not zero
  for (Quantizer quantize : Quantizers()) {
    QuantizedActivations q;
    quantize(x.data(), 2, 256, 256, &q);
    EXPECT_EQ(q.scales[0], 0.0f);
    EXPECT_EQ(q.scales[1], 3.0f / 127);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(q.q[size_t(j)], 0);
    for (int g = 0; g < 16; ++g) EXPECT_EQ(q.group_sums[size_t(g)], 0);
    EXPECT_EQ(q.q[300], -127);
    EXPECT_EQ(q.group_sums[300 / 16], -127);
  }
}

TEST(ActivationQuantizer, SimdIsBitIdenticalToScalar) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(8);
  for (int block : {32, 256}) {
    for (int64_t m : {1, 3, 7}) {
      const int64_t k = block * 5;
      // Rows of very different magnitudes, ties and zeros among them; x starts one float in.
      std::vector<float> x = Gaussian(m * k + 1, uint32_t(m + block));
      for (int64_t i = 0; i < m * k; ++i) {
        x[size_t(i + 1)] *= std::ldexp(1.0f, int(i / block % 7) * 5 - 15);
      }
      for (int64_t i = 0; i < 2 * block; i += 3) x[size_t(i + 1)] = 0.0f;
      std::fill(x.begin() + 1 + 3 * block, x.begin() + 1 + 4 * block, 0.0f);
      QuantizedActivations scalar, simd;
      QuantizeActivations(x.data() + 1, m, k, block, &scalar);
      avx2::QuantizeActivations(x.data() + 1, m, k, block, &simd);
      EXPECT_EQ(scalar.q, simd.q) << block << " " << m;
      ASSERT_EQ(scalar.scales.size(), simd.scales.size());
      EXPECT_EQ(std::memcmp(scalar.scales.data(), simd.scales.data(), scalar.scales.size() * 4), 0);
      EXPECT_EQ(scalar.group_sums, simd.group_sums);
      // The levels reproduce x to half a step.
      for (int64_t i = 0; i < m * k; ++i) {
        const float d = scalar.scales[size_t(i / block)];
        ASSERT_LE(std::fabs(x[size_t(i + 1)] - d * scalar.q[size_t(i)]), d * 0.5001f + 1e-30f);
      }
    }
  }
}

// --- integer matrix products ---

using Columns = void (*)(const QuantizedActivations&, const WeightView&, int64_t, int64_t, float*,
                         int64_t);

struct SimdColumns {
  const char* name;
  Columns columns;
};

std::vector<SimdColumns> SimdKernels() {
  std::vector<SimdColumns> kernels;
  if (IsaSupported(Isa::kAvx2)) kernels.push_back({"avx2", avx2::QuantDotColumns});
  if (IsaSupported(Isa::kAvx512)) kernels.push_back({"avx512", avx512::QuantDotColumns});
  return kernels;
}

// sum_k |w_nk| |x_ik| over the dequantised weights and the activations the levels stand for.
std::vector<double> Magnitudes(const QuantizedActivations& x, const WeightView& w) {
  const int64_t k = w.cols;
  std::vector<double> out(static_cast<size_t>(x.rows * w.rows));
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t n = 0; n < w.rows; ++n) {
    DequantizeValues(w.dtype, w.Row(n), k, row.data());
    for (int64_t i = 0; i < x.rows; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double xv = double(x.scales[size_t((i * k + j) / x.block)]) * x.q[size_t(i * k + j)];
        sum += std::fabs(row[size_t(j)] * xv);
      }
      out[size_t(i * w.rows + n)] = sum;
    }
  }
  return out;
}

TEST(QuantKernels, SimdMatchesScalarTwin) {
  const std::vector<SimdColumns> kernels = SimdKernels();
  if (kernels.empty()) GTEST_SKIP() << "no SIMD kernels on this CPU";
  std::mt19937 rng(2);
  for (DType type : kBlockTypes) {
    const int block = BlockSize(type);
    for (int64_t blocks : {1, 3, 8}) {
      const int64_t k = block * blocks;
      for (int64_t n : {1, 2, 3, 5, 9, 17}) {
        const std::vector<uint8_t> bytes = RandomBlocks(type, n * blocks, rng);
        const WeightView w{type, bytes.data(), n, k, RowBytes(type, k)};
        // AVX-512's 32-value blocks run 16 rows per register: whole, partial and several groups.
        for (int64_t m : {1, 2, 3, 5, 8, 13, 16, 40}) {
          const std::vector<float> x = Gaussian(m * k + 3, uint32_t(m * 131 + n * 7 + k));
          QuantizedActivations xq;
          QuantizeActivations(x.data() + 3, m, k, ActivationBlock(type), &xq);
          std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
          QuantDotColumns(xq, w, 0, n, want.data(), n);
          const std::vector<double> magnitude = Magnitudes(xq, w);
          for (const SimdColumns& kernel : kernels) {
            std::fill(got.begin(), got.end(), 0.0f);
            kernel.columns(xq, w, 0, n, got.data(), n);
            for (size_t i = 0; i < got.size(); ++i) {
              ASSERT_NEAR(got[i], want[i], 1e-6 * magnitude[i] + 1e-30)
                  << kernel.name << " " << DTypeName(type) << " m=" << m << " n=" << n << " k=" << k
                  << " at " << i;
            }
            // Columns split anywhere (as ParallelFor's chunks fall) give the same bits.
            std::vector<float> split(got.size());
            for (int64_t cut : {int64_t(1), n / 2, n - 1}) {
              if (cut <= 0 || cut >= n) continue;
              kernel.columns(xq, w, 0, cut, split.data(), n);
              kernel.columns(xq, w, cut, n, split.data() + cut, n);
              EXPECT_EQ(std::memcmp(split.data(), got.data(), got.size() * 4), 0)
                  << kernel.name << " " << DTypeName(type) << " cut " << cut;
            }
          }
        }
      }
    }
  }
}

// Weight bytes at their extremes (Q8_0 -128, the largest levels, scales of -128) against
// full-scale activations: the sums maddubs forms stay clear of its int16 saturation, so
// every kernel gives the exact integer result.
TEST(QuantKernels, ExtremeWeightBytesDoNotSaturate) {
  // 18 rows, so AVX-512's 32-value blocks run both their few-row and their 16-row kernel.
  const int64_t k = 512, m = 18;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      // Even rows: every level 127, scale 1; odd rows: alternating signs.
      x[size_t(i * k + j)] = i % 2 == 0 || j % 2 == 0 ? 127.0f : -127.0f;
    }
  }
  for (DType type : kBlockTypes) {
    const int64_t blocks = k / BlockSize(type);
    std::vector<uint8_t> bytes(static_cast<size_t>(RowBytes(type, k)), 0xFF);
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = bytes.data() + b * BlockBytes(type);
      switch (type) {
        case DType::kQ8_0:
          std::memset(block + 2, 0x80, 32);  // -128
          PutF16(block, 1.0f);
          break;
        case DType::kQ4_0:
          PutF16(block, 1.0f);  // levels 15 - 8 = 7
          break;
        case DType::kQ4_K:
        case DType::kQ5_K:
          PutF16(block, 1.0f);  // scales and mins 63, levels 15 / 31
          PutF16(block + 2, 0.0f);
          break;
        case DType::kQ6_K:
          std::memset(block + 192, 0x80, 16);  // scales -128, levels 63: -128 * (63 - 32)
          PutF16(block + 208, 1.0f);
          break;
        default:
          break;
      }
    }
    const WeightView w{type, bytes.data(), 1, k, RowBytes(type, k)};
    const double level_product = type == DType::kQ8_0   ? -128.0 * 127
                                 : type == DType::kQ4_0 ? 7.0 * 127
                                 : type == DType::kQ4_K ? 63.0 * 15 * 127
                                 : type == DType::kQ5_K ? 63.0 * 31 * 127
                                                        : -128.0 * 31 * 127;
    std::vector<Columns> all = {QuantDotColumns};
    for (const SimdColumns& kernel : SimdKernels()) all.push_back(kernel.columns);
    for (int64_t rows : {int64_t(2), m}) {
      QuantizedActivations xq;
      QuantizeActivations(x.data(), rows, k, ActivationBlock(type), &xq);
      for (Columns columns : all) {
        std::vector<float> y(static_cast<size_t>(rows), -1.0f);
        columns(xq, w, 0, 1, y.data(), 1);
        for (int64_t i = 0; i < rows; ++i) {
          EXPECT_EQ(y[size_t(i)], i % 2 == 0 ? float(level_product * double(k)) : 0.0f)
              << DTypeName(type) << " " << rows << " rows, row " << i;
        }
      }
    }
  }
}

// The numeric contract of ops/quant.h against the fp32 reference on the same weights:
// x = d * q + e with |e| <= d / 2 (plus 2^-22 |x| for the rounded inverse scale), so
// |y - y_ref| <= sum_k |w_k| (d(k) / 2 + 2^-22 |x_k|) + float rounding of both sides
// (bounded by 1e-5 * sum_k |w_k x_k| at these widths).
TEST(QuantKernels, ErrorAgainstFp32ActivationsWithinTheBound) {
  std::mt19937 rng(4);
  for (DType type : kBlockTypes) {
    const int64_t k = 768, n = 37, m = 11;
    const std::vector<uint8_t> bytes = RandomBlocks(type, n * k / BlockSize(type), rng);
    const WeightView w{type, bytes.data(), n, k, RowBytes(type, k)};
    std::vector<float> x = Gaussian(m * k + 1, 17);
    for (int64_t j = 0; j < k; j += 97) x[size_t(j + 1)] *= 20.0f;  // outliers widen d
    std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
    reference::MatMulColumns(x.data() + 1, m, w, 0, n, want.data(), n);
    QuantizedActivations xq;
    QuantizeActivations(x.data() + 1, m, k, ActivationBlock(type), &xq);
    std::vector<float> row(static_cast<size_t>(k));
    std::vector<SimdColumns> kernels = {{"scalar", QuantDotColumns}};
    for (const SimdColumns& kernel : SimdKernels()) kernels.push_back(kernel);
    for (const SimdColumns& kernel : kernels) {
      kernel.columns(xq, w, 0, n, got.data(), n);
      double worst_fraction = 0;  // of the bound, over all outputs
      for (int64_t c = 0; c < n; ++c) {
        DequantizeValues(type, w.Row(c), k, row.data());
        for (int64_t i = 0; i < m; ++i) {
          double bound = 0, magnitude = 0;
          for (int64_t j = 0; j < k; ++j) {
            const double xv = x[size_t(i * k + j + 1)];
            const double d = xq.scales[size_t((i * k + j) / xq.block)];
            bound += std::fabs(row[size_t(j)]) * (d / 2 + std::ldexp(std::fabs(xv), -22));
            magnitude += std::fabs(row[size_t(j)] * xv);
          }
          bound += 1e-5 * magnitude;
          const double err = std::fabs(double(got[size_t(i * n + c)]) - want[size_t(i * n + c)]);
          ASSERT_LE(err, bound) << kernel.name << " " << DTypeName(type) << " " << i << "," << c;
          worst_fraction = std::max(worst_fraction, err / bound);
        }
      }
      // Rounding errors add up like a random walk: far below the worst case, but not zero.
      EXPECT_GT(worst_fraction, 1e-3) << kernel.name << " " << DTypeName(type);
    }
  }
}

// Batch invariance: every output of every kernel, in both activation modes, has the bits of
// its row computed alone, for any row count, the row's position in the 4-row tiles, and
// columns cut anywhere (CpuBackend::MatMulBatch runs a batch's rows through one product).
TEST(QuantKernels, EveryOutputHasTheBitsOfItsRowAlone) {
  using FloatColumns =
      void (*)(const float*, int64_t, const WeightView&, int64_t, int64_t, float*, int64_t);
  struct Kernel {
    std::string name;
    Columns int8;         // on activations quantised per row
    FloatColumns floats;  // on fp32 activations
  };
  std::vector<Kernel> kernels = {{"scalar", QuantDotColumns, reference::MatMulColumns}};
  for (const SimdColumns& simd : SimdKernels()) {
    kernels.push_back({simd.name, simd.columns, avx2::QuantMatMulColumns});
  }
  std::mt19937 rng(7);
  const int64_t rows = 40, n = 11;
  // 19 blocks: AVX-512's 32-value kernels take 16 blocks or 16 rows per register, and a tail.
  for (const auto& [type, blocks] : [] {
         std::vector<std::pair<DType, int64_t>> shapes;
         for (DType type : kBlockTypes) {
           for (int64_t blocks : {3, 19}) shapes.emplace_back(type, blocks);
         }
         return shapes;
       }()) {
    const int64_t k = blocks * BlockSize(type);
    const std::vector<uint8_t> bytes = RandomBlocks(type, n * blocks, rng);
    const WeightView w{type, bytes.data(), n, k, RowBytes(type, k)};
    const std::vector<float> x = Gaussian(rows * k, uint32_t(k));  // [rows, K]
    for (const Kernel& kernel : kernels) {
      for (const bool int8 : {true, false}) {
        // Rows [first, first + m) of x, columns in two calls cut at `cut`, into y[m, N].
        auto product = [&](int64_t first, int64_t m, int64_t cut, float* y) {
          QuantizedActivations xq;
          if (int8) QuantizeActivations(x.data() + first * k, m, k, ActivationBlock(type), &xq);
          for (auto [begin, end] : {std::pair{int64_t(0), cut}, {cut, n}}) {
            if (int8) {
              kernel.int8(xq, w, begin, end, y + begin, n);
            } else {
              kernel.floats(x.data() + first * k, m, w, begin, end, y + begin, n);
            }
          }
        };
        std::vector<float> alone(static_cast<size_t>(rows * n));  // [rows, N]
        for (int64_t i = 0; i < rows; ++i) product(i, 1, n, alone.data() + i * n);
        for (int64_t m : {2, 3, 4, 5, 7, 8, 13, 16, 17, 33}) {
          for (int64_t first : {int64_t(0), int64_t(1), int64_t(6)}) {
            std::vector<float> got(static_cast<size_t>(m * n));
            product(first, m, 1 + (m + first) % (n - 1), got.data());
            ASSERT_EQ(std::memcmp(got.data(), alone.data() + first * n, got.size() * 4), 0)
                << kernel.name << (int8 ? " int8 " : " f32 ") << DTypeName(type) << " m=" << m
                << " first row=" << first;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace polestar
