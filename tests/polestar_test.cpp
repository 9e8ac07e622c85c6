// Polestar: its pure parts against hand-computed values, packet propagation against a full
// recompute, and aggregate agreement with the authors' code on the trained probe checkpoint
// (the standing equivalence with vanilla is decode_test's StandingTest).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend/registry.h"
#include "decode/generate.h"
#include "decode/policy.h"
#include "drift/drift.h"
#include "io/json_file.h"
#include "model/forward.h"
#include "ops/reference.h"
#include "test_support.h"

namespace polestar {
namespace {

TEST(DriftMetrics, KlAndCosineMatchHandComputedValues) {
  const float p[2] = {0.5f, 0.5f}, q[2] = {0.25f, 0.75f};
  EXPECT_NEAR(reference::KlDivergence(p, q, 2), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0),
              1e-7);
  EXPECT_NEAR(reference::KlDivergence(p, p, 2), 0.0, 1e-12);
  const float a[2] = {1, 0}, b[2] = {1, 1}, zero[2] = {0, 0};
  EXPECT_NEAR(reference::CosineSimilarity(a, b, 2), 1 / std::sqrt(2.0), 1e-7);
  EXPECT_EQ(reference::CosineSimilarity(a, zero, 2), 0.0);
}

TEST(KMeans, SeparatesDirectionsWithDeterministicSeeding) {
  // Two directions; seeds are points floor(i * 4 / 2) = 0 and 2.
  const std::vector<float> points = {1, 0, 2, 0.1f, 0, 1, 0.1f, 3};
  const Clustering c = SphericalKMeans(points, 4, 2, 2, 5);
  EXPECT_EQ(c.labels, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_NEAR(c.centroids[0], 3.0 / (2 + 1e-6), 1e-5);  // mean of un-normalised members
  EXPECT_NEAR(c.centroids[1], 0.1 / (2 + 1e-6), 1e-5);
  EXPECT_NEAR(c.centroids[3], 4.0 / (2 + 1e-6), 1e-5);
}

TEST(KMeans, FewPointsBecomeTheirOwnClustersAndEmptyClustersKeepTheirCentroid) {
  const std::vector<float> two = {1, 2, 3, 4};
  const Clustering own = SphericalKMeans(two, 2, 2, 3, 5);
  EXPECT_EQ(own.labels, (std::vector<int>{0, 1}));
  EXPECT_EQ(own.centroids, (std::vector<float>{1, 2, 3, 4, 1, 2}));
  // Three identical directions and k = 2: seed 1 (point 1) wins every tie? No: point 0's
  // seed comes first, so all points join cluster 0 and cluster 1 keeps its seed.
  const std::vector<float> same = {1, 1, 2, 2, 3, 3};
  const Clustering c = SphericalKMeans(same, 3, 2, 2, 5);
  EXPECT_EQ(c.labels, (std::vector<int>{0, 0, 0}));
  EXPECT_FLOAT_EQ(c.centroids[2], 2.0f);  // cluster 1 seeded with point floor(1 * 3 / 2) = 1
}

// The textbook loop (each similarity a double sum over the dimensions in order), the oracle
// of the side-by-side accumulation SphericalKMeans runs: Polestar's clusters, and so its
// decisions, must not move by a bit.
Clustering PlainSphericalKMeans(const std::vector<float>& points, int64_t n, int64_t d, int k,
                                int iterations) {
  auto normalise = [d](const float* row, float* out) {
    double norm = 0;
    for (int64_t j = 0; j < d; ++j) norm += double(row[j]) * row[j];
    const float inv = 1.0f / float(std::max(std::sqrt(norm), 1e-12));
    for (int64_t j = 0; j < d; ++j) out[j] = row[j] * inv;
  };
  std::vector<float> unit_points(points.size()), unit(size_t(k * d));
  for (int64_t i = 0; i < n; ++i) normalise(&points[size_t(i * d)], &unit_points[size_t(i * d)]);
  Clustering c;
  c.labels.assign(size_t(n), 0);
  for (int j = 0; j < k; ++j) {
    c.centroids.insert(c.centroids.end(), points.begin() + j * n / k * d,
                       points.begin() + (j * n / k + 1) * d);
  }
  for (int it = 0; it < iterations; ++it) {
    for (int j = 0; j < k; ++j) normalise(&c.centroids[size_t(j * d)], &unit[size_t(j * d)]);
    for (int64_t i = 0; i < n; ++i) {
      double best = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < k; ++j) {
        double s = 0;
        for (int64_t x = 0; x < d; ++x)
          s += double(unit_points[size_t(i * d + x)]) * unit[size_t(j * d + x)];
        if (s > best) {
          best = s;
          c.labels[size_t(i)] = j;
        }
      }
    }
    for (int j = 0; j < k; ++j) {
      std::vector<double> sum(size_t(d), 0.0);
      int64_t count = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (c.labels[size_t(i)] != j) continue;
        ++count;
        for (int64_t x = 0; x < d; ++x) sum[size_t(x)] += points[size_t(i * d + x)];
      }
      if (count == 0) continue;
      for (int64_t x = 0; x < d; ++x)
        c.centroids[size_t(j * d + x)] = float(sum[size_t(x)] / (double(count) + 1e-6));
    }
  }
  return c;
}

TEST(KMeans, EqualsThePlainLoopBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (auto [n, d, k] : {std::tuple{96, 128, 8}, {37, 33, 5}, {200, 64, 3}}) {
    std::vector<float> points(size_t(n * d));
    for (float& p : points) p = normal(rng);
    const Clustering got = SphericalKMeans(points, n, d, k, 5);
    const Clustering want = PlainSphericalKMeans(points, n, d, k, 5);
    EXPECT_EQ(got.labels, want.labels) << n << " x " << d;
    EXPECT_EQ(got.centroids, want.centroids) << n << " x " << d;
  }
}

TEST(Nvfp4, CodesFollowTheFormatDefinitions) {
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t code = 0; code < 8; ++code) {
    EXPECT_EQ(E2M1ToFloat(code), magnitudes[code]);
    EXPECT_EQ(E2M1ToFloat(uint8_t(code | 8)), -magnitudes[code]);
  }
  EXPECT_EQ(FloatToE2M1(2.5f), 4);    // tie between 2 (code 4) and 3 (code 5): even code
  EXPECT_EQ(FloatToE2M1(5.0f), 6);    // tie between 4 and 6: code 6 (value 4)
  EXPECT_EQ(FloatToE2M1(100.0f), 7);  // saturates at 6
  EXPECT_EQ(FloatToE2M1(-1.0f), 8 | 2);
  EXPECT_EQ(E4M3ToFloat(0x38), 1.0f);                  // exponent 7 = bias
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7f)));
  EXPECT_EQ(FloatToE4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7e);
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);  // halfway between 1 and 1.125: even mantissa
  EXPECT_EQ(FloatToE4M3(-2.0f), 0x80 | 0x40);
}

TEST(Nvfp4, RepresentableRowsRoundTripExactlyAndOthersStayClose) {
  // amax 6: tensor scale 6 / (6 * 448); the block scale is then exactly 448 (0x7e).
  std::vector<float> row = {6, 3, -1.5f, 0.5f, 0, -6, 4, 2, 1, -0.5f, 1.5f, -3, 2, 4, -4, 1};
  const float scale = Nvfp4TensorScale(6.0f);
  uint8_t scales[3], values[20];  // a row of 40 at most: 3 blocks, 20 bytes of codes
  QuantizeNvfp4(row.data(), int64_t(row.size()), scale, scales, values);
  EXPECT_EQ(scales[0], 0x7e);
  std::vector<float> back(row.size());
  DequantizeNvfp4(scales, values, int64_t(row.size()), scale, back.data());
  for (size_t i = 0; i < row.size(); ++i) EXPECT_NEAR(back[i], row[i], 1e-6) << i;
  std::vector<float> smooth(40);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = std::sin(float(i));
  const float s2 = Nvfp4TensorScale(1.0f);
  QuantizeNvfp4(smooth.data(), 40, s2, scales, values);
  std::vector<float> back2(40);
  DequantizeNvfp4(scales, values, 40, s2, back2.data());
  for (size_t i = 0; i < 40; ++i)
    EXPECT_NEAR(back2[i], smooth[i], 0.26);  // half of the widest gap (2 -> 3, scaled 1/6)
}

TEST(PolestarCommit, DriftGateFollowsAlphaTimesSquaredDistanceToTauS) {
  // Gate 10 * (0.9 - c)^2: 0.40 at c = 0.7, 0.10 at 0.8, 0.001 at 0.89.
  EXPECT_FALSE(PassesDriftGate(0.80, 0.099, 0.7, 0.9, 10, 2.0));
  EXPECT_TRUE(PassesDriftGate(0.80, 0.101, 0.7, 0.9, 10, 2.0));
  EXPECT_TRUE(PassesDriftGate(0.89, 0.0011, 0.7, 0.9, 10, 2.0));
  EXPECT_FALSE(PassesDriftGate(0.70, 1.0, 0.7, 0.9, 10, 2.0));  // floor is exclusive
  EXPECT_FALSE(PassesDriftGate(0.90, 1.0, 0.7, 0.9, 10, 2.0));  // tau_s is exclusive
  EXPECT_FALSE(PassesDriftGate(0.85, 2.0, 0.7, 0.9, 10, 2.0));  // the cap
  EXPECT_TRUE(PassesDriftGate(0.71, 0.39, 0.7, 0.9, 10, 2.0) == (0.39 >= 10 * 0.19 * 0.19));
}

TEST(PolestarCache, TriggerFiresOnBurstsOrAccumulatedCommits) {
  RefreshTrigger trigger(2);
  EXPECT_TRUE(trigger.Fire(2));   // more than one last step
  EXPECT_FALSE(trigger.Fire(1));  // 1 since refresh
  EXPECT_FALSE(trigger.Fire(1));  // 2
  EXPECT_TRUE(trigger.Fire(1));   // 3 > 2, resets
  EXPECT_FALSE(trigger.Fire(0));
  EXPECT_FALSE(trigger.Fire(1));
  trigger.Reset();
  EXPECT_FALSE(trigger.Fire(1));
}

// A hook that recomputes chosen rows at every layer, the way Polestar's packets do.
class RefreshRows : public LayerHook {
 public:
  RefreshRows(std::vector<int> block, std::vector<int> refreshed)
      : block_(std::move(block)), refreshed_(std::move(refreshed)) {}
  void BeforeQueries(LayerRows& rows) override {
    *rows.query_rows = block_;
    rows.query_rows->insert(rows.query_rows->end(), refreshed_.begin(), refreshed_.end());
  }

 private:
  std::vector<int> block_, refreshed_;
};

TEST(PolestarCache, PacketPropagationEqualsAFullRecomputeOfThoseRows) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const ModelConfig& c = model->config();
  std::vector<int> canvas = {3, 8, 1, 22, 40, 7, 9, 2};
  canvas.resize(24, c.mask_id);
  KvCache cache = MakeCache(*model, 24, true);
  Forward forward(*model, cache);
  StepPlan full;
  full.input_rows.resize(24);
  std::iota(full.input_rows.begin(), full.input_rows.end(), 0);
  forward.Run(canvas, full);
  // Commit a block, then run a dual-cache step that also refreshes rows 4..6 and 18..19.
  for (int p = 8; p < 12; ++p) canvas[size_t(p)] = 10 + p;
  RefreshRows hook({8, 9, 10, 11, 12, 13, 14, 15}, {4, 5, 6, 18, 19});
  StepPlan step;
  step.input_rows = {8, 9, 10, 11, 12, 13, 14, 15};
  step.hook = &hook;
  const StepResult result = forward.Run(canvas, step);
  EXPECT_EQ(result.rows_computed, 13);  // the last layer's rows feed nothing: no logit rows

  KvCache reference_cache = MakeCache(*model, 24, true);
  Forward reference(*model, reference_cache);
  reference.Run(canvas, full);
  const int64_t kv = int64_t(c.kv_heads) * c.head_dim;
  // Layer 1's rows of both caches: [24, C], [24, Hkv*D], [24, Hkv*D].
  auto rows = [](const KvCache& from, const float* data, int64_t width) {
    return testing::Download(from.backend(), data, from.positions() * width);
  };
  const std::vector<float> hidden = rows(cache, cache.hidden(1), c.width),
                           keys = rows(cache, cache.keys(1), kv),
                           values = rows(cache, cache.values(1), kv);
  const std::vector<float> want_hidden = rows(reference_cache, reference_cache.hidden(1), c.width),
                           want_keys = rows(reference_cache, reference_cache.keys(1), kv),
                           want_values = rows(reference_cache, reference_cache.values(1), kv);
  for (int p : {4, 5, 6, 18, 19, 8, 11}) {
    for (int64_t j = 0; j < c.width; ++j) {
      ASSERT_NEAR(hidden[size_t(p * c.width + j)], want_hidden[size_t(p * c.width + j)], 1e-5) << p;
    }
    for (int64_t j = 0; j < kv; ++j) {
      ASSERT_NEAR(keys[size_t(p * kv + j)], want_keys[size_t(p * kv + j)], 1e-5) << p;
      ASSERT_NEAR(values[size_t(p * kv + j)], want_values[size_t(p * kv + j)], 1e-5) << p;
    }
  }
}

// The model's drift ops against the same math written out with the scalar kernels: proxy
// queries W_q rmsnorm(x) without RoPE, over the cache's keys with RoPE undone.
// A canvas of `length`: eight prompt tokens, then masks.
std::vector<int> PromptAndMasks(const ModelConfig& config, int length) {
  std::vector<int> canvas = {3, 8, 1, 22, 40, 7, 9, 2};
  canvas.resize(size_t(length), config.mask_id);
  return canvas;
}

// `size` floats of a forward's backend memory, all NaN: an op that leaves one unwritten shows.
Buffer Poisoned(const Forward& forward, int64_t size) {
  Buffer buffer(forward.backend(), size, Buffer::Init::kNone);
  const std::vector<float> nans(size_t(size), std::numeric_limits<float>::quiet_NaN());
  forward.Upload(nans.data(), buffer.bytes(), buffer.data());
  return buffer;
}

TEST(DriftOps, ProxyAttentionIsTheUnrotatedAttentionOfTheProjectedRows) {
  for (const char* fixture : {"llada-tiny", "dream-tiny"}) {
    SCOPED_TRACE(fixture);
    auto model = Model::Load(testing::FixtureDir(fixture));
    const ModelConfig& c = model->config();
    const int length = 24;
    const std::vector<int> canvas = PromptAndMasks(c, length);
    KvCache cache = MakeCache(*model, length, true);
    Forward forward(*model, cache);
    forward.Run(canvas, {Range(0, length), {}, {}, nullptr});
    const int layer = c.layers - 1;
    const std::vector<int> rows = {3, 17};
    const int64_t m = int64_t(rows.size()), q_width = int64_t(c.heads) * c.head_dim;
    const Backend& backend = forward.backend();
    // The ops write backend memory, poisoned first; ReadHidden lays row i at out_rows[i].
    Buffer read = Poisoned(forward, m * c.width);  // [M, C]
    forward.ReadHidden(layer, rows, read.data(), std::vector<int>{1, 0});
    std::vector<float> x(size_t(m * c.width));  // [M, C] rows 17, 3
    forward.Download(read.data(), read.bytes(), x.data());
    const std::vector<float> hidden =
        testing::Download(cache.backend(), cache.hidden(layer), length * c.width);  // [L, C]
    for (int64_t j = 0; j < c.width; ++j) {
      ASSERT_EQ(x[size_t(j)], hidden[size_t(17 * c.width + j)]);
      ASSERT_EQ(x[size_t(c.width + j)], hidden[size_t(3 * c.width + j)]);
    }
    std::vector<float> got(size_t(m * c.heads * length));  // [M, H, L]
    DriftScratch scratch(backend);
    for (int call = 0; call < 2; ++call) {  // the second with warm scratch: the same bits
      Buffer probs = Poisoned(forward, int64_t(got.size()));  // [M, H, L]
      forward.ProxyAttention(layer, read.data(), m, probs.data(), scratch);
      std::vector<float> again(got.size());
      forward.Download(probs.data(), probs.bytes(), again.data());
      if (call == 1) {
        ASSERT_EQ(again, got);
      }
      got = again;
    }

    const LayerWeights& w = model->layer(layer);
    std::vector<float> normed(x.size()), q(size_t(m * q_width));
    reference::RmsNorm(x.data(), m, c.width, w.attn_norm.data(), c.rms_eps, normed.data());
    reference::MatMulColumns(normed.data(), m, w.wq, 0, q_width, q.data(), q_width);
    for (int64_t i = 0; i < m && !w.bq.empty(); ++i) {
      for (int64_t j = 0; j < q_width; ++j) q[size_t(i * q_width + j)] += w.bq[size_t(j)];
    }
    const int64_t kv = cache.kv_width();
    const std::vector<float> cached =
        testing::Download(cache.backend(), cache.keys(layer), length * kv);  // [L, Hkv*D]
    std::vector<float> keys = cached;
    const std::vector<int> positions = Range(0, length);
    UndoRope(keys.data(), positions, c.kv_heads, model->rope(), c.rope_interleaved);
    std::vector<float> want(got.size()), out(size_t(m * q_width));
    reference::Attention(q.data(), m, keys.data(), keys.data(), length, c.heads, c.kv_heads,
                         c.head_dim, out.data(), want.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << i;
    // The un-rotated keys really differ from the cached ones (RoPE was applied).
    Buffer unrotated_keys = Poisoned(forward, int64_t(keys.size()));  // [L, Hkv*D]
    forward.UnrotatedKeys(layer, unrotated_keys.data());
    std::vector<float> unrotated(keys.size());
    forward.Download(unrotated_keys.data(), unrotated_keys.bytes(), unrotated.data());
    EXPECT_EQ(unrotated, keys);
    EXPECT_NE(unrotated[size_t(5 * kv + 1)], cached[size_t(5 * kv + 1)]);
  }
}

// Captures each layer's attention probabilities of a step.
class CaptureAttention final : public LayerHook {
 public:
  void OnAttention(int layer, std::span<const int> query_rows, const RowsView& probs) override {
    ASSERT_EQ(probs.count(), int64_t(query_rows.size()));
    ASSERT_EQ(probs.width(), row_size_);
    probs_[layer].resize(query_rows.size() * size_t(row_size_));
    probs.Download(probs_[layer].data());
  }
  int64_t row_size_ = 0;
  std::map<int, std::vector<float>> probs_;
};

// The attention of cached rows (Elastic-Cache's "before the step") is the attention the
// forward pass computed for those rows when it cached them.
TEST(DriftOps, CachedRowsAttentionIsTheAttentionTheForwardComputed) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  const ModelConfig& c = model->config();
  const int length = 24;
  const std::vector<int> canvas = PromptAndMasks(c, length);
  KvCache cache = MakeCache(*model, length, true);
  Forward forward(*model, cache);
  CaptureAttention capture;
  capture.row_size_ = int64_t(c.heads) * length;
  forward.Run(canvas, {Range(0, length), {}, Range(0, c.layers), &capture});
  const std::vector<int> rows = {2, 11, 20};
  Buffer before;                                                    // [3, H, L]
  std::vector<float> got(rows.size() * size_t(capture.row_size_));  // [3, H, L]
  std::vector<double> drift(rows.size());
  for (int layer = 0; layer < c.layers; ++layer) {
    forward.CachedRowsAttention(layer, rows, before);
    forward.Download(before.data(), int64_t(got.size()) * 4, got.data());
    const std::vector<float>& all = capture.probs_[layer];  // [L, H, L]
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int64_t j = 0; j < capture.row_size_; ++j) {
        ASSERT_NEAR(got[r * size_t(capture.row_size_) + size_t(j)],
                    all[size_t(rows[r]) * size_t(capture.row_size_) + size_t(j)], 1e-6f)
            << "layer " << layer << " row " << rows[r];
      }
    }
    // Their drift from the captured rows is nil; from other rows it is not.
    Buffer captured(forward.backend(), int64_t(all.size()));  // [L, H, L]
    forward.Upload(all.data(), captured.bytes(), captured.data());
    const RowsView now(forward, captured.data(), length, capture.row_size_);
    EXPECT_NEAR(forward.MeanCrossHeadCosine(now, rows, before), 1.0, 1e-6);
    forward.HeadMeanDrift(DriftMetric::kKl, before.data(), before.data(), int64_t(rows.size()),
                          drift.data());
    for (double d : drift) EXPECT_EQ(d, 0.0);
    const std::vector<int> shifted = {5, 0, 3};  // other prompt tokens
    EXPECT_LT(forward.MeanCrossHeadCosine(now, shifted, before), 1.0 - 1e-6);
  }
}

// Block-causal capture (Polestar-Commit on LLaDA 2.x): rows of the first block see only that
// block, so their captured attention is the bidirectional attention of a canvas cut after it,
// with zeros on the keys beyond; rows of the second block see both blocks.
TEST(DriftOps, BlockCausalCaptureIsTheAttentionOfTheVisibleKeys) {
  auto model = Model::Load(testing::FixtureDir("llada2-a"));
  const ModelConfig& c = model->config();
  const int block = 8, length = 2 * block;
  const std::vector<int> canvas = PromptAndMasks(c, length);
  KvCache cache = MakeCache(*model, length, false);
  Forward forward(*model, cache);
  CaptureAttention capture;
  capture.row_size_ = int64_t(c.heads) * length;
  forward.Run(canvas, {Range(0, length), {}, Range(0, c.layers), &capture, block});

  const std::vector<int> first(canvas.begin(), canvas.begin() + block);
  KvCache cut_cache = MakeCache(*model, block, false);
  Forward cut_forward(*model, cut_cache);
  CaptureAttention cut;
  cut.row_size_ = int64_t(c.heads) * block;
  cut_forward.Run(first, {Range(0, block), {}, Range(0, c.layers), &cut});
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::vector<float>& got = capture.probs_[layer];  // [L, H, L]
    const std::vector<float>& want = cut.probs_[layer];     // [B, H, B]
    ASSERT_EQ(got.size(), size_t(length) * capture.row_size_);
    for (int r = 0; r < length; ++r) {
      for (int h = 0; h < c.heads; ++h) {
        const float* row = &got[(size_t(r) * c.heads + h) * length];
        if (r < block) {
          for (int j = 0; j < block; ++j) {
            ASSERT_NEAR(row[j], want[(size_t(r) * c.heads + h) * block + size_t(j)], 1e-6f)
                << "layer " << layer << " row " << r << " head " << h << " key " << j;
          }
        }
        double sum = 0, beyond = 0;
        for (int j = 0; j < length; ++j) (j < (r / block + 1) * block ? sum : beyond) += row[j];
        EXPECT_NEAR(sum, 1.0, 1e-5) << "layer " << layer << " row " << r;
        EXPECT_EQ(beyond, 0.0) << "layer " << layer << " row " << r;
      }
    }
  }
}

// A fixture prompt, and Polestar over four blocks of 8 in 32 steps.
constexpr int kPrompt[] = {1, 5, 9, 14, 22, 31, 40, 3};
DecodeOptions FourBlocksOfPolestar() {
  DecodeOptions options;
  options.policy = "polestar";
  options.gen_length = 32;
  options.block_length = 8;
  options.steps = 32;
  return options;
}

// The overlap worker clusters each layer on its own thread while the forward goes on; the
// result must not change (scripts/test.sh also runs this under ThreadSanitizer).
TEST(PolestarOverlap, WorkerThreadGivesTheSameTokens) {
  for (const char* fixture : {"llada-tiny", "dream-tiny"}) {
    SCOPED_TRACE(fixture);
    auto model = Model::Load(testing::FixtureDir(fixture));
    const DecodeOptions serial = FourBlocksOfPolestar();
    DecodeOptions overlap = serial;
    overlap.overlap = true;
    const GenerationResult expected = Generate(*model, kPrompt, serial);
    const GenerationResult result = Generate(*model, kPrompt, overlap);
    EXPECT_EQ(result.tokens, expected.tokens);
    EXPECT_EQ(result.nfe, expected.nfe);
  }
}

// Stopped at a block's first step (a cancellation, a callback's stop), the decoder waits for
// the overlap worker's clustering before the cache it reads goes. It once did not: the job ran
// on over freed memory (a failed check, or a use after free under AddressSanitizer).
TEST(PolestarOverlap, AStopAtABlockStartWaitsForTheWorker) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  DecodeOptions options = FourBlocksOfPolestar();
  options.overlap = true;
  for (int run = 0; run < 20; ++run) {
    int steps = 0;
    const GenerationResult result = Generate(*model, kPrompt, options, [&](const StepEvent&) {
      ++steps;
      return false;
    });
    EXPECT_EQ(steps, 1);
    EXPECT_TRUE(result.cancelled);
  }
}

// The NVFP4 store offloaded (Placement::kOffloaded: on a GPU, pinned host memory the kernels
// quantise into and dequantise from over the bus) holds the bits of the store in backend
// memory, so the tokens do not change. The CPU places both in host memory; the CUDA backend
// (a GPU, or its emulation in the sanitizer stage) places them apart.
TEST(PolestarOffload, TheOffloadedStoreGivesTheSameTokens) {
  auto model = Model::Load(testing::FixtureDir("llada-tiny"));
  DecodeOptions in_backend = FourBlocksOfPolestar();
  in_backend.nvfp4_hidden = true;
  DecodeOptions offloaded = in_backend;
  offloaded.offload_residuals = true;
  int ran = 0;
  for (const std::string spec : {"cpu", "cuda:activations=f32"}) {
    SCOPED_TRACE(spec);
    if (const std::string why = testing::BackendUnavailable(spec); !why.empty()) {
      std::printf("backend '%s' cannot run here: %s\n", spec.c_str(), why.c_str());
      continue;
    }
    const Backend& backend = BackendNamed(spec);
    model->UseBackend(backend);
    const GenerationResult expected = Generate(*model, kPrompt, in_backend);
    backend.ResetMemoryPeak();
    const int64_t offloaded_before = backend.Memory().offloaded_peak;  // -1: not counted
    const GenerationResult result = Generate(*model, kPrompt, offloaded);
    if (offloaded_before >= 0) {
      EXPECT_GT(backend.Memory().offloaded_peak, offloaded_before) << "nothing was offloaded";
    }
    EXPECT_EQ(result.tokens, expected.tokens);
    EXPECT_EQ(result.nfe, expected.nfe);
    // Refresh steps read the store.
    EXPECT_TRUE(result.step_kinds.contains(step_kind::Refresh(in_backend.topk_clusters)));
    ++ran;
  }
  EXPECT_GE(ran, 1);

  // The switch places the NVFP4 store: without the store it is an error, not a no-op.
  DecodeOptions without_store = offloaded;
  without_store.nvfp4_hidden = false;
  try {
    Generate(*model, kPrompt, without_store);
    ADD_FAILURE() << "offload_residuals without nvfp4_hidden decoded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("--offload-residuals needs --nvfp4-hidden"));
  }
}

struct ProbeScore {
  double accuracy = 0, tpf = 0;
};

ProbeScore RunProbe(const Model& model, const nlohmann::json& reference, DecodeOptions options) {
  const int eos = model.config().eos_id;
  const nlohmann::json vocab = ReadJsonFile(testing::FixtureDir("llada-probe") + "/vocab.json");
  const auto chars = vocab["chars"].get<std::vector<std::string>>();
  int correct = 0, forwards = 0, positions = 0;
  for (const auto& item : reference["prompts"]) {
    const auto prompt = item["prompt_ids"].get<std::vector<int>>();
    const GenerationResult r = Generate(model, prompt, options);
    std::string text;
    for (int t : r.generated) {
      if (t == eos) break;
      text += t < int(chars.size()) ? chars[size_t(t)] : "?";
    }
    correct += text == item["answer"].get<std::string>();
    forwards += r.nfe;
    positions += int(r.generated.size());
  }
  return {double(correct) / double(reference["prompts"].size()), double(positions) / forwards};
}

TEST(ProbeCheckpoint, PolestarAgreesWithTheAuthorsCodeInAggregate) {
  auto model = Model::Load(testing::FixtureDir("llada-probe"));
  const nlohmann::json reference =
      ReadJsonFile(testing::FixtureDir("llada-probe") + "/reference.json");
  DecodeOptions options;
  options.policy = "polestar";
  options.gen_length = 32;
  options.block_length = 8;
  options.steps = 32;
  options.threshold = 0.9;
  const ProbeScore full = RunProbe(*model, reference, options);
  EXPECT_NEAR(full.tpf, 6.32, 0.632);
  EXPECT_NEAR(full.accuracy, 0.825, 0.02);
  options.early_commit = false;
  const ProbeScore cache_only = RunProbe(*model, reference, options);
  EXPECT_NEAR(cache_only.tpf, 6.21, 0.621);
  EXPECT_NEAR(cache_only.accuracy, 0.817, 0.02);
  // The method's point on this model: clearly more tokens per forward than dual cache.
  options.policy = "fast-dllm-dual";
  options.steps = 4;
  const ProbeScore dual = RunProbe(*model, reference, options);
  EXPECT_NEAR(dual.tpf, 3.66, 0.05);
  EXPECT_GT(full.tpf, 1.5 * dual.tpf);
}

}  // namespace
}  // namespace polestar
