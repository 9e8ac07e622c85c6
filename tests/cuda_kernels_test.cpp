// The CUDA backend's kernels that no scalar kernel reproduces, against twins written here.
// They run wherever the backend named "cuda" can (a GPU, or the CUDA emulation) and skip with
// the reason elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "drift/drift.h"
#include "ops/bf16_matmul.h"
#include "ops/quant.h"
#include "test_support.h"

namespace polestar {
namespace {

constexpr char kReducedCuda[] = "cuda:activations=reduced";

float Bf16(float x) { return std::bit_cast<float>(uint32_t(RoundToBf16(x)) << 16); }

std::vector<float> Uniform(int64_t n, float low, float high, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = uniform(rng);
  return v;
}

struct AttentionShape {
  int heads, kv_heads, head_dim;
  int64_t m, l;
};

// The fused attention (reduced activations) against its twin: attention in double over q, k
// and v rounded to BF16, as the kernel rounds them. The twin leaves out the kernel's rounding
// of each unnormalised weight to BF16 (relative u = 2^-9; its total sums the rounded weights,
// so out is their exact weighted mean) and its FP32 sums: each normalised weight is within
// 2u / (1 - u) of p_j, so out within that of sum_j p_j |v_j|, plus 1e-6. Values in [0.25, 1]
// keep out near that sum (nothing cancels), so a key dropped or counted twice, or a tile's
// weights left unscaled by the running maximum's growth, moves out by far more.
void ExpectFusedAttentionMatchesItsTwin(const AttentionShape& s, uint32_t seed) {
  if (const std::string why = testing::BackendUnavailable(kReducedCuda); !why.empty()) {
    GTEST_SKIP() << "backend '" << kReducedCuda << "' cannot run here: " << why;
  }
  const Backend& cuda = BackendNamed(kReducedCuda);
  std::mt19937 rng(seed);
  const int64_t q_width = int64_t(s.heads) * s.head_dim,
                kv_width = int64_t(s.kv_heads) * s.head_dim;
  const std::vector<float> q = Uniform(s.m * q_width, -1.0f, 1.0f, rng);
  const std::vector<float> k = Uniform(s.l * kv_width, -1.0f, 1.0f, rng);
  const std::vector<float> v = Uniform(s.l * kv_width, 0.25f, 1.0f, rng);
  auto put = [&](const std::vector<float>& host) {
    Buffer buffer(cuda, int64_t(host.size()), Buffer::Init::kNone);
    cuda.Upload(host.data(), buffer.bytes(), buffer.data());
    return buffer;
  };
  const Buffer q_in = put(q), k_in = put(k), v_in = put(v);
  Buffer out = put(std::vector<float>(size_t(s.m * q_width), NAN));
  cuda.Attention(q_in.data(), s.m, k_in.data(), v_in.data(), s.l, s.heads, s.kv_heads, s.head_dim,
                 out.data());
  std::vector<float> got(size_t(s.m * q_width));
  cuda.Download(out.data(), out.bytes(), got.data());

  const double u = 1.0 / 512, scale = 1.0 / std::sqrt(double(s.head_dim));
  const int group = s.heads / s.kv_heads;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int h = 0; h < s.heads; ++h) {
      const int64_t kv_offset = int64_t(h / group) * s.head_dim;
      std::vector<double> weight(size_t(s.l));
      double largest = -INFINITY, total = 0;
      for (int64_t j = 0; j < s.l; ++j) {
        double dot = 0;
        for (int d = 0; d < s.head_dim; ++d) {
          dot += double(Bf16(q[size_t(i * q_width + h * s.head_dim + d)])) *
                 Bf16(k[size_t(j * kv_width + kv_offset + d)]);
        }
        weight[size_t(j)] = dot * scale;
        largest = std::max(largest, weight[size_t(j)]);
      }
      for (double& w : weight) total += (w = std::exp(w - largest));
      for (int d = 0; d < s.head_dim; ++d) {
        double want = 0;
        for (int64_t j = 0; j < s.l; ++j) {
          want += weight[size_t(j)] / total * Bf16(v[size_t(j * kv_width + kv_offset + d)]);
        }
        const size_t at = size_t(i * q_width + h * s.head_dim + d);
        ASSERT_NEAR(got[at], want, 2 * u / (1 - u) * want + 1e-6)
            << "row " << i << ", head " << h << ", dim " << d;
      }
    }
  }
}

// LLaDA's and Dream's head width; rows and keys that fill no 16-row or 64-key tile exactly.
TEST(CudaFusedAttention, MatchesItsTwinAtAModelsHeadWidth) {
  ExpectFusedAttentionMatchesItsTwin(
      {.heads = 4, .kv_heads = 2, .head_dim = 128, .m = 37, .l = 150}, 1);
}

// Dream's grouping (seven query heads a kv head) over fewer keys than one tile.
TEST(CudaFusedAttention, MatchesItsTwinWithSevenHeadsAKvHead) {
  ExpectFusedAttentionMatchesItsTwin({.heads = 7, .kv_heads = 1, .head_dim = 128, .m = 5, .l = 41},
                                     2);
}

// A head width that is no multiple of the tensor cores' 16 (padded inside the kernel), over
// a canvas of many key tiles, where the running maximum grows.
TEST(CudaFusedAttention, MatchesItsTwinWithPaddedHeadsOverManyTiles) {
  ExpectFusedAttentionMatchesItsTwin({.heads = 2, .kv_heads = 2, .head_dim = 24, .m = 3, .l = 1000},
                                     3);
}

struct TileProductShape {
  DType type;
  int64_t m, n, k;
};

// The tile product (few rows over quantised weights, reduced activations) against its twin:
// the product in double of x and the weights as the host decodes them (DequantizeValues), both
// rounded to BF16 as the kernel rounds them. The kernel's products of BF16 values are exact in
// FP32 and its sums FP32 (the tensor cores may round them toward zero): within 2u per term
// added, u = 2^-24, of sum |x w| over K terms and the splits' sums. A value decoded wrong, a
// tile or split dropped or counted twice moves an output by one of its terms, far more. And the
// same bits every run.
void ExpectTileProductMatchesItsTwin(const TileProductShape& s, uint32_t seed) {
  if (const std::string why = testing::BackendUnavailable(kReducedCuda); !why.empty()) {
    GTEST_SKIP() << "backend '" << kReducedCuda << "' cannot run here: " << why;
  }
  const Backend& cuda = BackendNamed(kReducedCuda);
  std::mt19937 rng(seed);
  const int64_t row_bytes = RowBytes(s.type, s.k);
  std::vector<uint8_t> stored(size_t(s.n * row_bytes));
  std::vector<float> decoded(size_t(s.n * s.k));  // [N, K]
  for (int64_t r = 0; r < s.n; ++r) {
    const std::vector<float> row = Uniform(s.k, -1.0f, 1.0f, rng);
    QuantizeValues(s.type, row.data(), s.k, stored.data() + r * row_bytes);
    DequantizeValues(s.type, stored.data() + r * row_bytes, s.k, decoded.data() + r * s.k);
  }
  const std::vector<float> x = Uniform(s.m * s.k, -1.0f, 1.0f, rng);
  Buffer w_in(cuda, int64_t(stored.size()), ElementType::kU8, Buffer::Init::kNone);
  cuda.Upload(stored.data(), w_in.bytes(), w_in.As<uint8_t>());
  const WeightView w{s.type, w_in.As<uint8_t>(), s.n, s.k, row_bytes};
  Buffer x_in(cuda, s.m * s.k, Buffer::Init::kNone);
  cuda.Upload(x.data(), x_in.bytes(), x_in.data());
  auto product = [&] {
    std::vector<float> got(size_t(s.m * s.n), NAN);
    Buffer y(cuda, s.m * s.n, Buffer::Init::kNone);
    cuda.Upload(got.data(), y.bytes(), y.data());  // NaN where nothing is written
    cuda.MatMul(x_in.data(), s.m, w, y.data());
    cuda.Download(y.data(), y.bytes(), got.data());
    return got;
  };
  const std::vector<float> got = product();
  const double terms = double(s.k) + 16;  // K products, the splits' sums with room
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double want = 0, magnitude = 0;
      for (int64_t c = 0; c < s.k; ++c) {
        const double term =
            double(Bf16(x[size_t(i * s.k + c)])) * Bf16(decoded[size_t(j * s.k + c)]);
        want += term;
        magnitude += std::fabs(term);
      }
      ASSERT_NEAR(got[size_t(i * s.n + j)], want, 2 * terms * 0x1p-24 * magnitude + 1e-6)
          << DTypeName(s.type) << " row " << i << ", output " << j;
    }
  }
  const std::vector<float> again = product();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(again[i])) << "output " << i;
  }
}

// The 32-value types over a K that ends half way through a 64-value step, split in 5 (the
// last split shorter); one row, and the most rows the kernel takes.
TEST(CudaTileProduct, MatchesItsTwinOnThirtyTwoValueBlocks) {
  for (const DType type : {DType::kQ8_0, DType::kQ4_0}) {
    ExpectTileProductMatchesItsTwin({.type = type, .m = 1, .n = 70, .k = 1056}, 4);
    ExpectTileProductMatchesItsTwin({.type = type, .m = 64, .n = 70, .k = 1056}, 5);
  }
}

// The K-quants: rows that fill no 16-row tile and weight rows no 64-row tile, K in 4 splits.
TEST(CudaTileProduct, MatchesItsTwinOnKQuants) {
  for (const DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    ExpectTileProductMatchesItsTwin({.type = type, .m = 37, .n = 200, .k = 1024}, 6);
  }
}

// An offloaded Buffer (Polestar's NVFP4 store with --offload-residuals) is pinned host memory
// that the kernels use as device memory: they quantise into it and dequantise from it the
// bits of a store in device memory, and once the stream has run the host reads those bits
// where they lie (this test alone looks: host code never touches backend memory). Copies
// into and out of it, a Buffer's copy among them, take the host's side of the bus.
TEST(CudaOffloaded, TheStoreIsPinnedHostMemoryTheKernelsUseAsDeviceMemory) {
  if (const std::string why = testing::BackendUnavailable(kReducedCuda); !why.empty()) {
    GTEST_SKIP() << "backend '" << kReducedCuda << "' cannot run here: " << why;
  }
  const Backend& cuda = BackendNamed(kReducedCuda);
  std::mt19937 rng(11);
  const int64_t width = 40, rows = 6;  // a width whose last scale block is partial
  const std::vector<float> x = Uniform(rows * width, -2.0f, 2.0f, rng);
  const std::vector<float> base = Uniform(2 * width, -1.0f, 1.0f, rng);
  const std::vector<int> x_rows = {0, 1, 2, 3, 4, 5}, labels = {0, 1, 0, 1, 1, 0};
  const std::vector<int> store_rows = {5, 0, 3, 1, 4, 2};
  Buffer device_x(cuda, int64_t(x.size())), device_base(cuda, int64_t(base.size()));
  cuda.Upload(x.data(), device_x.bytes(), device_x.data());
  cuda.Upload(base.data(), device_base.bytes(), device_base.data());
  const float tensor_scale = Nvfp4TensorScale(3.0f);
  const int64_t scale_bytes = rows * Nvfp4ScaleBytes(width),
                value_bytes = rows * Nvfp4ValueBytes(width);

  struct Store {
    Buffer scales, values;
  };
  auto quantised = [&](Placement placement) {
    Store store{Buffer(cuda, scale_bytes, ElementType::kU8, Buffer::Init::kZero, placement),
                Buffer(cuda, value_bytes, ElementType::kU8, Buffer::Init::kZero, placement)};
    cuda.QuantizeResiduals(device_x.data(), x_rows, device_base.data(), labels, width, tensor_scale,
                           store.scales.As<uint8_t>(), store.values.As<uint8_t>(), store_rows);
    return store;
  };
  const Store in_device = quantised(Placement::kBackend);
  Store offloaded = quantised(Placement::kOffloaded);
  ASSERT_EQ(offloaded.scales.placement(), Placement::kOffloaded);
  cuda.Synchronize();
  std::vector<uint8_t> want_scales(static_cast<size_t>(scale_bytes)),
      want_values(static_cast<size_t>(value_bytes));
  cuda.Download(in_device.scales.As<uint8_t>(), scale_bytes, want_scales.data());
  cuda.Download(in_device.values.As<uint8_t>(), value_bytes, want_values.data());
  const uint8_t* host_scales = offloaded.scales.As<uint8_t>();
  const uint8_t* host_values = offloaded.values.As<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(host_scales, host_scales + scale_bytes), want_scales);
  EXPECT_EQ(std::vector<uint8_t>(host_values, host_values + value_bytes), want_values);

  // A copy stays offloaded; a download of it and its dequantised rows give the same bits.
  const Store copied{offloaded.scales, offloaded.values};
  ASSERT_EQ(copied.values.placement(), Placement::kOffloaded);
  std::vector<uint8_t> copied_values(static_cast<size_t>(value_bytes));
  cuda.Download(copied.values.As<uint8_t>(), value_bytes, copied_values.data());
  EXPECT_EQ(copied_values, want_values);
  const std::vector<int> read_rows = {4, 1, 2}, read_labels = {1, 1, 0}, out_rows = {2, 0, 1};
  auto dequantised = [&](const Store& store) {
    Buffer out(cuda, 3 * width);
    cuda.DequantizeResiduals(store.scales.As<uint8_t>(), store.values.As<uint8_t>(), read_rows,
                             device_base.data(), read_labels, width, tensor_scale, out.data(),
                             out_rows);
    std::vector<float> host(size_t(out.size()));
    cuda.Download(out.data(), out.bytes(), host.data());
    return host;
  };
  const std::vector<float> want = dequantised(in_device);
  const Store* stores[] = {&offloaded, &copied};
  for (const Store* store : stores) {
    const std::vector<float> got = dequantised(*store);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "value " << i;
  }
  // Growing keeps the placement.
  offloaded.values.Reserve(2 * value_bytes);
  EXPECT_EQ(offloaded.values.placement(), Placement::kOffloaded);

  // Offloaded memory is counted apart from the device's.
  cuda.Synchronize();
  cuda.ResetMemoryPeak();
  const MemoryUse before = cuda.Memory();
  ASSERT_GE(before.held, 0);
  constexpr int64_t kBytes = 1 << 20;
  {
    const Buffer extra(cuda, kBytes, ElementType::kU8, Buffer::Init::kNone, Placement::kOffloaded);
    const MemoryUse with = cuda.Memory();
    EXPECT_EQ(with.offloaded, before.offloaded + kBytes);
    EXPECT_EQ(with.held, before.held);
  }
  EXPECT_EQ(cuda.Memory().offloaded, before.offloaded);
  EXPECT_EQ(cuda.Memory().offloaded_peak, before.offloaded + kBytes);
  {
    const Buffer extra(cuda, kBytes, ElementType::kU8, Buffer::Init::kNone);
    EXPECT_GE(cuda.Memory().held, before.held + kBytes);
  }
  cuda.Synchronize();  // the free has run
  EXPECT_EQ(cuda.Memory().held, before.held);
  EXPECT_GE(cuda.Memory().peak, before.held + kBytes);
}

// A CUDA backend of its own (not BackendNamed's, shared by the binary's tests): these tests
// grow its scratch, or turn its recording off.
std::unique_ptr<Backend> OwnCuda(const BackendOptions& options) {
  for (const BackendEntry& entry : RegisteredBackends()) {
    if (entry.name == "cuda") return entry.make(options);
  }
  return nullptr;
}

// A recording (CUDA graph) replays its ops over what memory holds at the replay, with the
// host lists they staged as they were (however many), whatever was staged since; once a product of
// more rows has replaced the scratch the recorded product used, it refuses to replay.
TEST(CudaRecording, AReplayIssuesTheRecordedOpsOverWhatMemoryHoldsNow) {
  if (const std::string why = testing::BackendUnavailable(kReducedCuda); !why.empty()) {
    GTEST_SKIP() << "backend '" << kReducedCuda << "' cannot run here: " << why;
  }
  const std::unique_ptr<Backend> owned = OwnCuda({{"activations", "reduced"}});
  const Backend& cuda = *owned;
  std::mt19937 rng(5);
  constexpr int64_t kRows = 4, kN = 24, kK = 32;
  std::vector<uint16_t> weights;  // [N, K] BF16
  for (const float value : Uniform(kN * kK, -1.0f, 1.0f, rng))
    weights.push_back(RoundToBf16(value));
  Buffer resident(cuda, kN * kK, ElementType::kBf16, Buffer::Init::kNone);
  cuda.Upload(weights.data(), resident.bytes(), resident.As<uint16_t>());
  const WeightView w{DType::kBF16, reinterpret_cast<const uint8_t*>(resident.As<uint16_t>()), kN,
                     kK, kK * 2};
  Buffer x(cuda, kRows * kK), y(cuda, kRows * kN), picked(cuda, 2 * kN), other(cuda, 2 * kN);
  const int64_t segments[] = {kRows};
  const std::vector<int> picked_rows = {3, 1}, other_rows = {0, 2};
  auto ops = [&] {
    cuda.MatMulBatch(x.data(), segments, w, y.data());
    // More lists than the recording's first memory for them holds: the last from its second.
    for (int copy = 0; copy < 300; ++copy) {
      cuda.CopyRows(y.data(), copy % 2 ? other_rows : picked_rows, picked.data(), {}, kN);
    }
  };
  auto run_on = [&](const std::vector<float>& input, const std::function<void()>& issue) {
    cuda.Upload(input.data(), x.bytes(), x.data());
    issue();
    std::vector<float> out(size_t(picked.size()));
    cuda.Download(picked.data(), picked.bytes(), out.data());
    return out;
  };
  const std::vector<float> a = Uniform(kRows * kK, -1.0f, 1.0f, rng);
  const std::vector<float> b = Uniform(kRows * kK, -1.0f, 1.0f, rng);
  const std::vector<float> want_a = run_on(a, ops), want_b = run_on(b, ops);
  ASSERT_NE(want_a, want_b);

  std::unique_ptr<OpGraph> graph;
  EXPECT_EQ(run_on(a, [&] { graph = cuda.Record(ops); }), want_a);  // recording runs them once
  ASSERT_NE(graph, nullptr);
  // Lists staged since move the staging ring on (past a wrap); the recording keeps its own.
  for (int i = 0; i < 600; ++i) cuda.CopyRows(y.data(), other_rows, other.data(), {}, kN);
  EXPECT_EQ(run_on(b, [&] { ASSERT_TRUE(cuda.Replay(*graph)); }), want_b);
  EXPECT_EQ(run_on(a, [&] { ASSERT_TRUE(cuda.Replay(*graph)); }), want_a);

  constexpr int64_t kMoreRows = 4096;
  Buffer more_x(cuda, kMoreRows * kK), more_y(cuda, kMoreRows * kN);
  const int64_t more_segments[] = {kMoreRows};
  cuda.MatMulBatch(more_x.data(), more_segments, w, more_y.data());
  EXPECT_FALSE(cuda.Replay(*graph));
}

// An op a capture cannot hold (a download, an allocation) leaves the recorded ops run once as
// issued, says why, and turns recording off; so does graphs=off, silently.
TEST(CudaRecording, AnOpACaptureCannotHoldRunsAsIssuedAndEndsRecording) {
  if (const std::string why = testing::BackendUnavailable(kReducedCuda); !why.empty()) {
    GTEST_SKIP() << "backend '" << kReducedCuda << "' cannot run here: " << why;
  }
  struct Case {
    BackendOptions options;
    bool downloads;  // else it allocates
    const char* says;
  };
  const Case cases[] = {
      {{}, true, "recording a step as a CUDA graph failed (an op downloaded 32 bytes"},
      {{}, false, "recording a step as a CUDA graph failed (an op allocated 4 bytes"},
      {{{"graphs", "off"}}, true, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const std::unique_ptr<Backend> cuda = OwnCuda(c.options);
    const std::vector<float> ones(8, 1.0f);
    Buffer x(*cuda, 8);
    cuda->Upload(ones.data(), x.bytes(), x.data());
    std::vector<float> seen(8, 0.0f);
    auto ops = [&] {
      cuda->AddInPlace(x.data(), x.data(), 8);  // x doubles
      if (c.downloads) {
        cuda->Download(x.data(), x.bytes(), seen.data());
      } else {
        const Buffer scratch(*cuda, 1);
      }
    };
    ::testing::internal::CaptureStderr();
    const std::unique_ptr<OpGraph> graph = cuda->Record(ops);
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(graph, nullptr);
    if (*c.says == '\0') {
      EXPECT_EQ(said, "");
    } else {
      EXPECT_THAT(said, ::testing::HasSubstr(c.says));
    }
    cuda->Download(x.data(), x.bytes(), seen.data());
    EXPECT_EQ(seen, std::vector<float>(8, 2.0f));  // the ops ran once
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(cuda->Record(ops), nullptr);  // off now: run as issued, and said no more
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
    cuda->Download(x.data(), x.bytes(), seen.data());
    EXPECT_EQ(seen, std::vector<float>(8, 4.0f));
  }
  EXPECT_THAT(
      [] {
        OwnCuda({{"graphs", "maybe"}});
      },
      testing::ThrowsErrorContaining({"backend option graphs=maybe: expected on or off"}));
}

}  // namespace
}  // namespace polestar
