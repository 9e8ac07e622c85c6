// Every op of the backend seam (backend/backend.h) on every registered backend, as ggml's
// test-backend-ops: fresh random inputs uploaded into the backend's buffers, outputs poisoned
// (NaN) beforehand, results downloaded and compared with the scalar reference
// (CpuBackend(Isa::kScalar) over the same host values, with the same activation precision) at
// a tolerance stated per op:
// * exact ops (copies, additions, clamps, RoPE, the probabilities and drift kernels that are
//   scalar on every kernel set, routing, embedding): bit for bit where the backend's contract
//   says exact_to_scalar_twins, else within a stated relative bound;
// * rounded ops (products, norms, SiLU, attention): within the bound a change of summation
//   order allows, stated per op and, for the products, per weight type and activation
//   precision.
// A backend whose contract says batch_invariant also gives each segment of a batched product
// the bits it gets alone. Backends that cannot run here are skipped with the reason.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "base/dtype.h"
#include "base/error.h"
#include "drift/drift.h"
#include "ops/quant.h"
#include "test_support.h"

namespace polestar {
namespace {

constexpr double kUlp = std::numeric_limits<float>::epsilon() / 2;  // 2^-24

// A registered backend, once per activation precision where it takes that option.
struct Case {
  std::string spec;
  ActivationPrecision activations = ActivationPrecision::kF32;  // the reference's
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const BackendEntry& entry : RegisteredBackends()) {
    const bool has_activations = std::ranges::any_of(
        entry.options, [](const BackendOptionSpec& option) { return option.key == "activations"; });
    if (!has_activations) {
      cases.push_back({std::string(entry.name)});
      continue;
    }
    cases.push_back({std::string(entry.name) + ":activations=f32", ActivationPrecision::kF32});
    cases.push_back(
        {std::string(entry.name) + ":activations=reduced", ActivationPrecision::kReduced});
  }
  return cases;
}

void PrintTo(const Case& c, std::ostream* out) { *out << c.spec; }

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return testing::BackendTestName(info.param.spec);
}

std::vector<float> Random(int64_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = uniform(rng);
  return v;
}

// Weights of one type: the host bytes (the reference reads them), their values dequantised,
// and the backend's copy, viewed.
struct Weights {
  std::vector<uint8_t> bytes;  // [N, RowBytes(K)]
  std::vector<float> values;   // [N, K] what the bytes hold
  WeightView host;
  Buffer resident;  // bytes, in the backend (kU8)
  WeightView view;  // over resident
};

class BackendConformance : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::BackendUnavailable(GetParam().spec); !why.empty()) {
      GTEST_SKIP() << "backend '" << GetParam().spec << "' cannot run here: " << why;
    }
    backend_ = &BackendNamed(GetParam().spec);
    exact_ = backend_->contract().exact_to_scalar_twins;
  }

  const Backend& backend() const { return *backend_; }

  // Host values in a fresh backend buffer.
  Buffer Put(const std::vector<float>& host) const {
    Buffer buffer(backend(), int64_t(host.size()), Buffer::Init::kNone);
    backend().Upload(host.data(), buffer.bytes(), buffer.data());
    return buffer;
  }
  // A buffer of `n` NaNs, for outputs: an element the op does not write stays NaN.
  Buffer Poisoned(int64_t n) const {
    return Put(std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN()));
  }
  std::vector<float> Get(const Buffer& buffer) const { return GetAs<float>(buffer); }
  // Host values of any element type in a fresh backend buffer of `type`, and back.
  template <class T>
  Buffer PutAs(const std::vector<T>& host, ElementType type) const {
    Buffer buffer(backend(), int64_t(host.size()), type, Buffer::Init::kNone);
    backend().Upload(host.data(), buffer.bytes(), buffer.As<T>());
    return buffer;
  }
  template <class T>
  std::vector<T> GetAs(const Buffer& buffer) const {
    std::vector<T> host(size_t(buffer.size()));
    backend().Download(buffer.As<T>(), buffer.bytes(), host.data());
    return host;
  }

  Weights MakeWeights(DType type, int64_t n, int64_t k, std::mt19937& rng) const {
    Weights w;
    const int64_t row_bytes = RowBytes(type, k);
    w.bytes.resize(size_t(n * row_bytes));
    w.values.resize(size_t(n * k));
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> row = Random(k, 1.0f, rng);
      QuantizeValues(type, row.data(), k, w.bytes.data() + r * row_bytes);
      DequantizeValues(type, w.bytes.data() + r * row_bytes, k, w.values.data() + r * k);
    }
    w.host = {type, w.bytes.data(), n, k, row_bytes};
    w.resident = Buffer(backend(), int64_t(w.bytes.size()), ElementType::kU8, Buffer::Init::kNone);
    backend().Upload(w.bytes.data(), w.resident.bytes(), w.resident.As<uint8_t>());
    w.view = w.host;
    w.view.data = w.resident.As<uint8_t>();
    return w;
  }

  // Every element within `bound(i)` of want (0: the same bits, NaN never), with a label.
  template <class Bound>
  void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, Bound bound,
                   const std::string& label) const {
    ASSERT_EQ(got.size(), want.size()) << label;
    for (size_t i = 0; i < got.size(); ++i) {
      const double allowed = bound(i);
      if (allowed == 0) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << label << " [" << i << "]: " << got[i] << " vs " << want[i];
      } else {
        ASSERT_LE(std::fabs(double(got[i]) - double(want[i])), allowed)
            << label << " [" << i << "]: " << got[i] << " vs " << want[i];
      }
    }
  }
  void ExpectExact(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& label) const {
    ExpectClose(
        got, want, [](size_t) { return 0.0; }, label);
  }
  // An op exact on the scalar twins: bit for bit on a backend that says so, else within
  // `relative` of each value (plus a floor for values near zero).
  void ExpectTwin(const std::vector<float>& got, const std::vector<float>& want, double relative,
                  const std::string& label) const {
    ExpectClose(
        got, want, [&](size_t i) { return exact_ ? 0.0 : relative * std::fabs(want[i]) + 1e-30; },
        label);
  }

  // got[begin, end) still holds the poison its output was filled with (NaN for floats): the op
  // wrote nothing outside what it names.
  template <class T>
  void ExpectPoisoned(const std::vector<T>& got, size_t begin, size_t end, T poison,
                      const std::string& label) const {
    ASSERT_LE(end, got.size()) << label;
    for (size_t i = begin; i < end; ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        ASSERT_TRUE(std::isnan(got[i])) << label << " [" << i << "] written: " << got[i];
      } else {
        ASSERT_EQ(got[i], poison) << label << " [" << i << "] written";
      }
    }
  }

  // Attention of m query rows over l keys (GQA: heads over kv_heads), queries within
  // +-q_scale, against the reference. Scores of |q k| <= D summed in another order, the
  // softmax's exp and total, and l weighted values: out within 1e-5 for these magnitudes
  // (ops_test derives the per-element bound), or with reduced activations within
  // ReducedAttentionBound; the probabilities within 1e-6; out the same bits with or without
  // them; the probabilities alone (the drift measurements' input) the scalar kernel's bits on
  // an exact backend, else within `alone_relative` of each value.
  void CheckAttention(int heads, int kv_heads, int head_dim, int64_t m, int64_t l, float q_scale,
                      double alone_relative, std::mt19937& rng) const {
    const std::vector<float> q = Random(m * heads * head_dim, q_scale, rng);
    const std::vector<float> k = Random(l * kv_heads * head_dim, 1.0f, rng);
    const std::vector<float> v = Random(l * kv_heads * head_dim, 1.0f, rng);
    const Buffer q_in = Put(q), k_in = Put(k), v_in = Put(v);
    Buffer out = Poisoned(m * heads * head_dim), probs = Poisoned(m * heads * l);
    backend().Attention(q_in.data(), m, k_in.data(), v_in.data(), l, heads, kv_heads, head_dim,
                        out.data(), probs.data());
    std::vector<float> want_out(size_t(m * heads * head_dim)), want_probs(size_t(m * heads * l));
    reference_.Attention(q.data(), m, k.data(), v.data(), l, heads, kv_heads, head_dim,
                         want_out.data(), want_probs.data());
    const std::vector<double> allowed =
        GetParam().activations == ActivationPrecision::kReduced
            ? ReducedAttentionBound(q, k, v, want_probs, m, l, heads, kv_heads, head_dim)
            : std::vector<double>(want_out.size(), 0.0);
    ExpectClose(
        Get(out), want_out, [&](size_t i) { return std::max(1e-5, allowed[i]); }, "Attention out");
    ExpectClose(
        Get(probs), want_probs, [](size_t) { return 1e-6; }, "Attention probs");
    Buffer no_probs = Poisoned(m * heads * head_dim);
    backend().Attention(q_in.data(), m, k_in.data(), v_in.data(), l, heads, kv_heads, head_dim,
                        no_probs.data());
    ExpectExact(Get(no_probs), Get(out), "Attention without probabilities, against with");

    Buffer alone = Poisoned(m * heads * l);
    backend().AttentionProbabilities(q_in.data(), m, k_in.data(), l, heads, kv_heads, head_dim,
                                     alone.data());
    std::vector<float> want_alone(size_t(m * heads * l));
    reference_.AttentionProbabilities(q.data(), m, k.data(), l, heads, kv_heads, head_dim,
                                      want_alone.data());
    ExpectTwin(Get(alone), want_alone, alone_relative, "AttentionProbabilities");
  }

  // With reduced activations a backend may multiply q, k, the probabilities and v as BF16
  // (relative rounding u = 2^-9; 2^-8 here, for margin) with FP32 sums. A score then moves by
  // at most delta = 2u sum_d |q_d k_jd| / sqrt(D); every weight by a factor within e^(+-a),
  // a = 2 max_j delta + u (the scores' shift and the weight's own rounding), so each normalised
  // weight by p_j (e^(2a) - 1); each value by u |v_j|. out_c is off by at most
  // (e^(2a) - 1 + u e^(2a)) sum_j p_j |v_jc|, plus 1e-6 for the FP32 sums.
  static std::vector<double> ReducedAttentionBound(const std::vector<float>& q,
                                                   const std::vector<float>& k,
                                                   const std::vector<float>& v,
                                                   const std::vector<float>& probs, int64_t m,
                                                   int64_t l, int heads, int kv_heads,
                                                   int head_dim) {
    const double u = 1.0 / 256;
    const int group = heads / kv_heads;
    std::vector<double> bound(size_t(m * heads * head_dim));
    for (int64_t i = 0; i < m; ++i) {
      for (int h = 0; h < heads; ++h) {
        const int64_t kv_offset = int64_t(h / group) * head_dim;
        const float* qh = &q[size_t((i * heads + h) * head_dim)];
        double delta = 0;
        for (int64_t j = 0; j < l; ++j) {
          const float* kj = &k[size_t(j * kv_heads * head_dim + kv_offset)];
          double magnitude = 0;
          for (int d = 0; d < head_dim; ++d) magnitude += std::fabs(double(qh[d]) * kj[d]);
          delta = std::max(delta, 2 * u * magnitude / std::sqrt(double(head_dim)));
        }
        const double a = 2 * delta + u, growth = std::exp(2 * a);
        for (int d = 0; d < head_dim; ++d) {
          double mean_magnitude = 0;  // sum_j p_j |v_jd|
          for (int64_t j = 0; j < l; ++j) {
            mean_magnitude += double(probs[size_t((i * heads + h) * l + j)]) *
                              std::fabs(v[size_t(j * kv_heads * head_dim + kv_offset + d)]);
          }
          bound[size_t((i * heads + h) * head_dim + d)] =
              (growth - 1 + u * growth) * mean_magnitude + 1e-6;
        }
      }
    }
    return bound;
  }

  // The reference: the scalar kernels, on host memory, with the case's activation precision.
  const CpuBackend reference_{Isa::kScalar, GetParam().activations};
  const Backend* backend_ = nullptr;
  bool exact_ = false;
};

// The bound on one output of x[M, K] · w[N, K]^T against the scalar product: summation order
// (2 (K + 1) u of sum |x w|), and with reduced activations the rounding a backend may apply
// that the scalar twin does not (BF16 activations for BF16 weights: 2^-8 of sum |x w|).
// For block-quantised weights the scalar twin itself rounds the activations to 8-bit levels
// (ops/quant.h QuantizeActivations: per block of ActivationBlock values a spacing
// d = amax / 127, |x - d q| <= d / 2 + 2^-22 |x|), which a backend whose contract is not
// exact may skip, multiplying the dequantised weights with BF16 activations (CUDA) instead:
// it then differs from the reference by that rounding, sum |w| (amax / 254 + 2^-22 |x|) over
// each block, plus its own BF16 rounding of x and w ((1 + 2^-8)^2 - 1 of sum |x w|).
double ProductBound(const Weights& w, const ActivationPrecision activations, bool exact,
                    const float* x, int64_t n) {
  const int64_t k = w.host.cols;
  const float* row = &w.values[size_t(n * k)];
  double magnitude = 0;
  for (int64_t t = 0; t < k; ++t) magnitude += std::fabs(double(x[t]) * row[t]);
  double relative = 2.0 * double(k + 1) * kUlp;
  double activation_rounding = 0;
  if (activations == ActivationPrecision::kReduced && w.host.dtype == DType::kBF16) {
    relative += std::ldexp(1.0, -8);
  }
  if (activations == ActivationPrecision::kReduced && IsBlockQuantized(w.host.dtype) && !exact) {
    relative += std::ldexp(1.0, -7) + std::ldexp(1.0, -16);
    const int block = ActivationBlock(w.host.dtype);
    for (int64_t b = 0; b < k; b += block) {
      double amax = 0;
      for (int64_t t = b; t < b + block; ++t) amax = std::max(amax, std::fabs(double(x[t])));
      for (int64_t t = b; t < b + block; ++t) {
        activation_rounding +=
            std::fabs(double(row[t])) * (amax / 254 + std::ldexp(std::fabs(double(x[t])), -22));
      }
    }
  }
  return relative * magnitude + activation_rounding + 1e-30;
}

TEST_P(BackendConformance, MemoryZeroCopyUploadDownload) {
  std::mt19937 rng(1);
  const Buffer zeroed(backend(), 37);
  ExpectExact(Get(zeroed), std::vector<float>(37, 0.0f), "zeroed buffer");
  const std::vector<float> values = Random(37, 5.0f, rng);
  const Buffer source = Put(values);
  ExpectExact(Get(source), values, "upload then download");
  const Buffer copy = source;  // CopyBytes
  ExpectExact(Get(copy), values, "copied buffer");
  Buffer zero = Put(values);
  backend().Zero(zero.data() + 3, 30);
  std::vector<float> want = values;
  std::fill(want.begin() + 3, want.begin() + 33, 0.0f);
  ExpectExact(Get(zero), want, "Zero");
  // Typed buffers: bytes in, the same bytes out.
  const std::vector<uint16_t> halves = {1, 0x3f80, 0xffff, 7};
  Buffer typed(backend(), 4, ElementType::kBf16, Buffer::Init::kNone);
  backend().Upload(halves.data(), typed.bytes(), typed.As<uint16_t>());
  std::vector<uint16_t> back(4);
  backend().Download(typed.As<uint16_t>(), typed.bytes(), back.data());
  EXPECT_EQ(back, halves);
  backend().Synchronize();
}

// Memory a device does not have is an Error naming the shortage, not a crash; and the backend
// goes on working. (Host-memory backends are left out: a sanitizer aborts an impossible
// malloc rather than return null.)
TEST_P(BackendConformance, AnAllocationBeyondTheDeviceIsAnError) {
  if (backend().contract().host_memory) GTEST_SKIP() << "host memory: malloc's own failure";
  EXPECT_THAT([&] { Buffer(backend(), int64_t(1) << 50, Buffer::Init::kNone); },
              ::testing::Throws<Error>());
  std::mt19937 rng(11);
  const std::vector<float> values = Random(5, 1.0f, rng);
  ExpectExact(Get(Put(values)), values, "upload then download after the failure");
}

TEST_P(BackendConformance, SideQueueRunsOpsAndHandsBackErrors) {
  std::mt19937 rng(2);
  const std::vector<float> x = Random(100, 1.0f, rng), y = Random(100, 1.0f, rng);
  Buffer sum = Put(x);
  const Buffer addend = Put(y);
  const std::unique_ptr<SideQueue> queue = backend().MakeSideQueue();
  queue->Run([&] { backend().AddInPlace(sum.data(), addend.data(), 100); });
  queue->Wait();
  std::vector<float> want = x;
  reference_.AddInPlace(want.data(), y.data(), 100);
  ExpectExact(Get(sum), want, "AddInPlace on the side queue");
  queue->Run([] { throw Error("side job failed"); });
  EXPECT_THROW(queue->Wait(), Error);
}

TEST_P(BackendConformance, MatMulEveryWeightTypeAndRowCount) {
  std::mt19937 rng(3);
  const int64_t n = 70;  // not a multiple of any panel
  for (const DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    // Float types also on a width that is no vector's multiple; block types on whole blocks.
    std::vector<int64_t> widths = {256};
    if (!IsBlockQuantized(type)) widths.push_back(77);
    for (const int64_t k : widths) {
      const Weights w = MakeWeights(type, n, k, rng);
      const std::vector<float> bias = Random(n, 1.0f, rng);
      const Buffer bias_in = Put(bias);
      for (const int64_t m : {1, 3, 8, 17}) {  // the dot path's row counts and the panel path's
        const std::vector<float> x = Random(m * k, 1.0f, rng);
        const Buffer x_in = Put(x);
        for (const bool with_bias : {false, true}) {
          Buffer y = Poisoned(m * n);
          backend().MatMul(x_in.data(), m, w.view, y.data(), with_bias ? bias_in.data() : nullptr);
          std::vector<float> want(size_t(m * n));
          reference_.MatMul(x.data(), m, w.host, want.data(), with_bias ? bias.data() : nullptr);
          ExpectClose(
              Get(y), want,
              [&](size_t i) {
                return ProductBound(w, GetParam().activations, exact_, &x[i / n * k],
                                    int64_t(i % n));
              },
              Cat("MatMul ", DTypeName(type), " M=", m, " K=", k, with_bias ? " +bias" : ""));
        }
      }
    }
  }
}

// Segments of one batched product: each within the product bound of the reference, and, on
// a batch-invariant backend, each bit for bit what the backend gives that segment alone.
TEST_P(BackendConformance, MatMulBatchSegments) {
  std::mt19937 rng(4);
  const int64_t n = 40, k = 256;
  const std::vector<int64_t> segments = {1, 0, 17, 3, 8};
  const int64_t m = 29;
  for (const DType type : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_K}) {
    const Weights w = MakeWeights(type, n, k, rng);
    const std::vector<float> x = Random(m * k, 1.0f, rng);
    const Buffer x_in = Put(x);
    Buffer y = Poisoned(m * n);
    backend().MatMulBatch(x_in.data(), segments, w.view, y.data());
    const std::vector<float> got = Get(y);
    std::vector<float> want(size_t(m * n));
    reference_.MatMulBatch(x.data(), segments, w.host, want.data());
    const std::string label = Cat("MatMulBatch ", DTypeName(type));
    ExpectClose(
        got, want,
        [&](size_t i) {
          return ProductBound(w, GetParam().activations, exact_, &x[i / n * k], int64_t(i % n));
        },
        label);
    if (!backend().contract().batch_invariant) continue;
    int64_t row = 0;
    for (const int64_t rows : segments) {
      Buffer alone = Poisoned(rows * n);
      backend().MatMul(x_in.data() + row * k, rows, w.view, alone.data());
      ExpectExact(std::vector<float>(got.begin() + row * n, got.begin() + (row + rows) * n),
                  Get(alone), Cat(label, " segment at row ", row, " alone"));
      row += rows;
    }
  }
}

// A product added to y: within the product bound (plus the addition's rounding) of y plus the
// reference's product, for the row counts of every path (a device's few-row, tile and library
// products) and a split into sequences; on a batch-invariant backend, bit for bit its
// MatMulBatch and AddInPlace.
TEST_P(BackendConformance, MatMulAddBatchAddsTheProductToY) {
  std::mt19937 rng(15);
  const int64_t n = 70;
  for (const DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_K}) {
    const int64_t k = 256;
    const Weights w = MakeWeights(type, n, k, rng);
    for (const std::vector<int64_t>& segments :
         std::vector<std::vector<int64_t>>{{1}, {5}, {3, 0, 9}, {70}}) {
      int64_t m = 0;
      for (const int64_t rows : segments) m += rows;
      const std::vector<float> x = Random(m * k, 1.0f, rng), y = Random(m * n, 4.0f, rng);
      const Buffer x_in = Put(x);
      Buffer got = Put(y);
      backend().MatMulAddBatch(x_in.data(), segments, w.view, got.data());
      std::vector<float> want(size_t(m * n));
      reference_.MatMulBatch(x.data(), segments, w.host, want.data());
      for (size_t i = 0; i < want.size(); ++i) want[i] += y[i];
      const std::string label = Cat("MatMulAddBatch ", DTypeName(type), " M=", m);
      const std::vector<float> sums = Get(got);
      ExpectClose(
          sums, want,
          [&](size_t i) {
            return ProductBound(w, GetParam().activations, exact_, &x[i / n * k], int64_t(i % n)) +
                   2 * kUlp * std::fabs(want[i]);
          },
          label);
      if (!backend().contract().batch_invariant) continue;
      Buffer product = Poisoned(m * n), unfused = Put(y);
      backend().MatMulBatch(x_in.data(), segments, w.view, product.data());
      backend().AddInPlace(unfused.data(), product.data(), m * n);
      ExpectExact(sums, Get(unfused), label + " against MatMulBatch and AddInPlace");
    }
  }
}

// Products of normed rows: the norm's rows and every product (weights of several types in one
// call, one with a bias) bit for bit what RmsNorm and then MatMulBatch give on the same
// backend, for a few rows and many, and with the rows normed in place.
TEST_P(BackendConformance, RmsNormProductsAreTheNormAndThenEachProduct) {
  std::mt19937 rng(16);
  const int64_t c = 256;
  std::vector<Weights> weights;
  for (const auto& [type, n] : std::vector<std::pair<DType, int64_t>>{
           {DType::kBF16, 40}, {DType::kQ8_0, 70}, {DType::kF32, 24}, {DType::kQ4_K, 64}}) {
    weights.push_back(MakeWeights(type, n, c, rng));
  }
  const std::vector<float> norm = Random(c, 2.0f, rng), bias = Random(70, 1.0f, rng);
  const Buffer norm_in = Put(norm), bias_in = Put(bias);
  for (const std::vector<int64_t>& segments :
       std::vector<std::vector<int64_t>>{{1}, {2, 5}, {66, 4}}) {
    int64_t m = 0;
    for (const int64_t rows : segments) m += rows;
    for (const bool in_place : {false, true}) {
      const std::string label = Cat("RmsNormProducts M=", m, in_place ? " in place" : "");
      const std::vector<float> x = Random(m * c, 3.0f, rng);
      Buffer x_in = Put(x), normed = Poisoned(m * c);
      std::vector<Buffer> outputs;
      std::vector<NormedProduct> products;
      for (const Weights& w : weights) {
        outputs.push_back(Poisoned(m * w.view.rows));
        products.push_back({.w = w.view,
                            .y = outputs.back().data(),
                            .bias = w.view.dtype == DType::kQ8_0 ? bias_in.data() : nullptr});
      }
      float* normed_out = in_place ? x_in.data() : normed.data();
      backend().RmsNormProducts(x_in.data(), segments, c, norm_in.data(), 1e-5f, normed_out,
                                products);

      const Buffer x_again = Put(x);
      Buffer want_normed = Poisoned(m * c);
      backend().RmsNorm(x_again.data(), m, c, norm_in.data(), 1e-5f, want_normed.data());
      ExpectExact(Get(in_place ? x_in : normed), Get(want_normed), label + " normed rows");
      for (size_t p = 0; p < products.size(); ++p) {
        Buffer want = Poisoned(m * products[p].w.rows);
        backend().MatMulBatch(want_normed.data(), segments, products[p].w, want.data(),
                              products[p].bias);
        ExpectExact(Get(outputs[p]), Get(want),
                    Cat(label, " product ", p, " (", DTypeName(products[p].w.dtype), ")"));
      }
    }
  }
}

// Row groups whose sizes only backend memory holds (a mixture's experts): every group's rows
// within the product bound of the reference, which multiplies the groups one by one, and, on
// a batch-invariant backend, every sequence's rows of a group bit for bit what the backend
// gives them alone. Groups empty in every sequence and in some, and one of more than 64 rows
// (a GPU's tile of rows).
TEST_P(BackendConformance, MatMulGroupsReadTheirSizesInBackendMemory) {
  std::mt19937 rng(14);
  const int64_t n = 70, k = 256, sequences = 3;
  const int groups = 5;
  const std::vector<int> counts = {2, 0, 9, 40, 1,   // [S, G]: sequence 0
                                   0, 0, 0, 30, 5,   // sequence 1
                                   3, 0, 1, 7,  0};  // sequence 2
  const Buffer counts_in = PutAs(counts, ElementType::kI32);
  std::vector<int> group_of_row;  // [rows]
  for (int g = 0; g < groups; ++g) {
    for (int64_t s = 0; s < sequences; ++s) {
      group_of_row.insert(group_of_row.end(), size_t(counts[size_t(s * groups + g)]), g);
    }
  }
  const int64_t rows = int64_t(group_of_row.size());
  for (const DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_K}) {
    std::vector<Weights> weights;
    std::vector<WeightView> views, host_views;  // [G]
    for (int g = 0; g < groups; ++g) {
      weights.push_back(MakeWeights(type, n, k, rng));
      views.push_back(weights.back().view);
      host_views.push_back(weights.back().host);
    }
    const std::vector<float> x = Random(rows * k, 1.0f, rng);
    const Buffer x_in = Put(x);
    Buffer y = Poisoned(rows * n);
    backend().MatMulGroups(x_in.data(), rows, views, counts_in.As<int>(), sequences, y.data());
    const std::vector<float> got = Get(y);
    std::vector<float> want(size_t(rows * n));
    reference_.MatMulGroups(x.data(), rows, host_views, counts.data(), sequences, want.data());
    const std::string label = Cat("MatMulGroups ", DTypeName(type));
    ExpectClose(
        got, want,
        [&](size_t i) {
          const Weights& w = weights[size_t(group_of_row[i / n])];
          return ProductBound(w, GetParam().activations, exact_, &x[i / n * k], int64_t(i % n));
        },
        label);
    if (!backend().contract().batch_invariant) continue;
    int64_t row = 0;
    for (int g = 0; g < groups; ++g) {
      for (int64_t s = 0; s < sequences; ++s) {
        const int64_t count = counts[size_t(s * groups + g)];
        Buffer alone = Poisoned(count * n);
        backend().MatMul(x_in.data() + row * k, count, views[size_t(g)], alone.data());
        ExpectExact(std::vector<float>(got.begin() + row * n, got.begin() + (row + count) * n),
                    Get(alone), Cat(label, " group ", g, " sequence ", s, " alone"));
        row += count;
      }
    }
  }
}

TEST_P(BackendConformance, LmHeadBatchNormsInPlaceThenProjects) {
  std::mt19937 rng(5);
  const int64_t c = 256, vocab = 90;
  const std::vector<int64_t> segments = {2, 5};
  const int64_t m = 7;
  for (const DType type : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_K}) {
    const Weights lm_head = MakeWeights(type, vocab, c, rng);
    const std::vector<float> x = Random(m * c, 3.0f, rng), norm = Random(c, 1.0f, rng);
    Buffer x_in = Put(x);
    const Buffer norm_in = Put(norm);
    Buffer logits = Poisoned(m * vocab);
    backend().LmHeadBatch(x_in.data(), segments, c, norm_in.data(), 1e-6f, lm_head.view,
                          logits.data());
    std::vector<float> normed = x, want(size_t(m * vocab));
    reference_.LmHeadBatch(normed.data(), segments, c, norm.data(), 1e-6f, lm_head.host,
                           want.data());
    const std::string label = Cat("LmHeadBatch ", DTypeName(type));
    // The norm as RmsNorm's bound; the logits as the product's over the normed rows, plus
    // what the norm's rounding moves them by.
    ExpectClose(
        Get(x_in), normed, [&](size_t i) { return 2 * (c + 4) * kUlp * std::fabs(normed[i]); },
        label + " normed rows");
    ExpectClose(
        Get(logits), want,
        [&](size_t i) {
          const double product = ProductBound(lm_head, GetParam().activations, exact_,
                                              &normed[i / vocab * c], int64_t(i % vocab));
          return product * (1 + double(c + 4) / double(c + 1));
        },
        label + " logits");
  }
}

TEST_P(BackendConformance, RmsNormSiluMulAddClamp) {
  std::mt19937 rng(6);
  const int64_t m = 5, c = 77, n = m * c;
  const std::vector<float> x = Random(n, 3.0f, rng), weight = Random(c, 2.0f, rng);
  const Buffer x_in = Put(x), weight_in = Put(weight);
  Buffer out = Poisoned(n);
  backend().RmsNorm(x_in.data(), m, c, weight_in.data(), 1e-5f, out.data());
  std::vector<float> want(static_cast<size_t>(n));
  reference_.RmsNorm(x.data(), m, c, weight.data(), 1e-5f, want.data());
  // Two sums of C squares in another order, then one division and two products.
  ExpectClose(
      Get(out), want, [&](size_t i) { return 2 * (c + 4) * kUlp * std::fabs(want[i]); }, "RmsNorm");

  const std::vector<float> gate = Random(n, 30.0f, rng), up = Random(n, 3.0f, rng);
  Buffer gate_in = Put(gate);
  const Buffer up_in = Put(up);
  backend().SiluMul(gate_in.data(), up_in.data(), n);
  std::vector<float> silu = gate;
  reference_.SiluMul(silu.data(), up.data(), n);
  // exp and a division, each within a few units in the last place.
  ExpectClose(
      Get(gate_in), silu, [&](size_t i) { return 8 * kUlp * std::fabs(silu[i]) + 1e-30; },
      "SiluMul");

  // One IEEE addition per element, and a clamp: exact on every backend.
  Buffer sum = Put(x);
  backend().AddInPlace(sum.data(), up_in.data(), n);
  std::vector<float> sum_want = x;
  reference_.AddInPlace(sum_want.data(), up.data(), n);
  ExpectExact(Get(sum), sum_want, "AddInPlace");
  Buffer clamped = Put(x);
  backend().Clamp(clamped.data(), n, 1.5f);
  std::vector<float> clamp_want = x;
  reference_.Clamp(clamp_want.data(), n, 1.5f);
  ExpectExact(Get(clamped), clamp_want, "Clamp");
}

TEST_P(BackendConformance, RopeFullPartialInterleavedAndUndone) {
  std::mt19937 rng(7);
  const int heads = 3;
  const std::vector<int> positions = {0, 9, 4, 31};
  for (const int rotary_dim : {16, 8}) {  // full, and partial (R < D)
    const RopeTable host_table(16, rotary_dim, 32, 10000.0f);
    const Buffer cos = Put({host_table.cos.begin(), host_table.cos.end()});
    const Buffer sin = Put({host_table.sin.begin(), host_table.sin.end()});
    const RopeTable table =
        host_table.WithAngles({cos.data(), size_t(cos.size())}, {sin.data(), size_t(sin.size())});
    for (const bool interleaved : {false, true}) {
      const std::vector<float> x = Random(int64_t(positions.size()) * heads * 16, 2.0f, rng);
      Buffer rotated = Put(x);
      backend().ApplyRope(rotated.data(), positions, heads, table, interleaved);
      std::vector<float> want = x;
      reference_.ApplyRope(want.data(), positions, heads, host_table, interleaved);
      const std::string label = Cat("R=", rotary_dim, interleaved ? " interleaved" : "");
      ExpectTwin(Get(rotated), want, 4 * kUlp, "ApplyRope " + label);
      backend().UndoRope(rotated.data(), positions, heads, table, interleaved);
      reference_.UndoRope(want.data(), positions, heads, host_table, interleaved);
      ExpectTwin(Get(rotated), want, 4 * kUlp, "UndoRope " + label);
    }
  }
}

TEST_P(BackendConformance, AttentionAndItsProbabilities) {
  std::mt19937 rng(8);
  CheckAttention(/*heads=*/6, /*kv_heads=*/2, /*head_dim=*/24, /*m=*/5, /*l=*/37,
                 /*q_scale=*/1.0f, /*alone_relative=*/1e-5, rng);
}

// A long canvas (L = 8192): softmax rows far longer than a device block has threads, and
// value products summing over L. Each probability is ~1/L, so the bounds above hold for out
// and probs; the probabilities alone are held relative to each value, and the scalar twin's
// total, summed in order over L, may be off by up to L u relative where a device sums in a tree.
TEST_P(BackendConformance, AttentionOverALongCanvas) {
  std::mt19937 rng(9);
  const int64_t l = 8192;
  CheckAttention(/*heads=*/4, /*kv_heads=*/2, /*head_dim=*/16, /*m=*/3, l, /*q_scale=*/2.0f,
                 /*alone_relative=*/1e-5 + double(l) * kUlp, rng);
}

// A model's head width (128, LLaDA's and Dream's) with rows and keys that fill no tile of a
// fused kernel exactly (16 rows and 64 keys, say): 37 rows over 150 keys, GQA 4 over 2.
TEST_P(BackendConformance, AttentionAtAModelsHeadWidth) {
  std::mt19937 rng(10);
  CheckAttention(/*heads=*/4, /*kv_heads=*/2, /*head_dim=*/128, /*m=*/37, /*l=*/150,
                 /*q_scale=*/0.5f, /*alone_relative=*/1e-5, rng);
}

// A batched step's attention: 35 calls (more than a device may take in one launch), each of
// its own rows over its own keys (some over the first keys of a longer cache, as a
// block-causal run; one without rows; one without keys), give each call's out as Attention
// gives it alone, bit for bit, and write nothing else.
TEST_P(BackendConformance, AttentionBatchGivesEachCallItsOwnAttention) {
  std::mt19937 rng(11);
  const int heads = 4, kv_heads = 2, head_dim = 16, calls = 35;
  const int64_t q_width = heads * head_dim, kv_width = kv_heads * head_dim;
  std::vector<Buffer> qs, ks, vs, batched, alone;
  std::vector<AttentionCall> batch;
  for (int i = 0; i < calls; ++i) {
    const int64_t rows = i == 3 ? 0 : 1 + i % 5, length = 1 + (7 * i) % 40;
    const int64_t keys = i == 5 ? 0 : i % 3 == 0 ? (length + 1) / 2 : length;
    qs.push_back(Put(Random(rows * q_width, 1.0f, rng)));
    ks.push_back(Put(Random(length * kv_width, 1.0f, rng)));
    vs.push_back(Put(Random(length * kv_width, 1.0f, rng)));
    batched.push_back(Poisoned(rows * q_width + 1));  // one past out: never written
    alone.push_back(Poisoned(rows * q_width));
    batch.push_back({.q = qs.back().data(),
                     .rows = rows,
                     .k = ks.back().data(),
                     .v = vs.back().data(),
                     .keys = keys,
                     .out = batched.back().data()});
    backend().Attention(qs.back().data(), rows, ks.back().data(), vs.back().data(), keys, heads,
                        kv_heads, head_dim, alone.back().data());
  }
  backend().AttentionBatch(batch, heads, kv_heads, head_dim);
  for (int i = 0; i < calls; ++i) {
    const std::vector<float> got = Get(batched[size_t(i)]);
    const size_t n = got.size() - 1;
    ExpectExact(std::vector<float>(got.begin(), got.begin() + ptrdiff_t(n)), Get(alone[size_t(i)]),
                "AttentionBatch call " + std::to_string(i));
    ExpectPoisoned(got, n, n + 1, std::numeric_limits<float>::quiet_NaN(),
                   "AttentionBatch past call " + std::to_string(i));
  }
}

TEST_P(BackendConformance, RouteTopKWithBiasGroupsAndNormalisation) {
  std::mt19937 rng(9);
  const int64_t m = 9;
  const int experts = 16;
  const std::vector<float> logits = Random(m * experts, 4.0f, rng);
  const std::vector<float> bias = Random(experts, 0.5f, rng);
  const Buffer logits_in = Put(logits), bias_in = Put(bias);
  const RouterSpec plain{.experts = experts, .top_k = 4};
  RouterSpec grouped{.experts = experts,
                     .top_k = 4,
                     .score = RouterScore::kSigmoid,
                     .bias = bias.data(),
                     .bias_in_weights = false,
                     .groups = 4,
                     .top_groups = 2,
                     .normalize = true,
                     .scaling = 2.5f};
  for (const RouterSpec& host_spec : {plain, grouped}) {
    RouterSpec spec = host_spec;
    if (spec.bias != nullptr) spec.bias = bias_in.data();
    const size_t count = size_t(m * spec.top_k);
    std::vector<int> want_chosen(count);
    std::vector<float> want_weights(count);
    Buffer chosen_out = PutAs(std::vector<int>(count, -1), ElementType::kI32);
    Buffer weights_out = Poisoned(int64_t(count));
    backend().RouteTopK(logits_in.data(), m, spec, chosen_out.As<int>(), weights_out.data());
    reference_.RouteTopK(logits.data(), m, host_spec, want_chosen.data(), want_weights.data());
    const std::vector<int> chosen = GetAs<int>(chosen_out);
    const std::vector<float> weights = Get(weights_out);
    const std::string label = host_spec.groups > 1 ? "grouped sigmoid" : "softmax";
    EXPECT_EQ(chosen, want_chosen) << "RouteTopK " << label;
    ExpectTwin(weights, want_weights, 1e-6, "RouteTopK weights " + label);
  }
}

TEST_P(BackendConformance, RowCopiesCombineExpertsAndEmbed) {
  std::mt19937 rng(10);
  const int64_t width = 19;
  const std::vector<float> src = Random(6 * width, 2.0f, rng);  // [6, width]
  const Buffer src_in = Put(src);
  const std::vector<int> from = {5, 0, 3}, to = {1, 4, 2};
  const std::vector<float> background = Random(6 * width, 2.0f, rng);
  // Gather, scatter and both: the rows not written keep the background's values.
  for (const auto& [src_rows, dst_rows] :
       {std::pair{from, std::vector<int>{}}, std::pair{std::vector<int>{}, to},
        std::pair{from, to}}) {
    Buffer dst = Put(background);
    backend().CopyRows(src_in.data(), src_rows, dst.data(), dst_rows, width);
    std::vector<float> want = background;
    reference_.CopyRows(src.data(), src_rows, want.data(), dst_rows, width);
    ExpectExact(Get(dst), want,
                Cat("CopyRows ", src_rows.size(), " from, ", dst_rows.size(), " to"));
  }
  // Rows 3 wide out of rows 19 wide into rows 7 wide.
  Buffer strided = Put(background);
  backend().CopyStrided(src_in.data() + 2, width, strided.data() + 1, 7, 5, 3);
  std::vector<float> strided_want = background;
  reference_.CopyStrided(src.data() + 2, width, strided_want.data() + 1, 7, 5, 3);
  ExpectExact(Get(strided), strided_want, "CopyStrided");

  // dst row r += scales[p] * src row p over its slots in order: a product and a sum each,
  // rounded as the twin rounds them.
  const std::vector<float> scales = {0.5f, -1.25f, 3.0f, 0.75f, -2.0f, 1.5f};  // [6]
  const std::vector<int> slots = {0, 4, 1, 2, 3, 5};                           // [M = 3, k = 2]
  Buffer accumulated = Put(background);
  const Buffer scales_in = Put(scales), slots_in = PutAs(slots, ElementType::kI32);
  backend().CombineExperts(src_in.data(), scales_in.data(), slots_in.As<int>(), 3, 2, width,
                           accumulated.data());
  std::vector<float> accumulated_want = background;
  reference_.CombineExperts(src.data(), scales.data(), slots.data(), 3, 2, width,
                            accumulated_want.data());
  ExpectExact(Get(accumulated), accumulated_want, "CombineExperts");

  const std::vector<int> tokens = {7, 2, 0, 7, 5};
  const std::vector<int> rows = {4, 1, 0};
  for (const DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_K}) {
    const Weights table = MakeWeights(type, 8, 256, rng);
    Buffer out = Poisoned(int64_t(rows.size()) * 256);
    backend().Embed(table.view, tokens, rows, out.data());
    std::vector<float> want(size_t(out.size()));
    reference_.Embed(table.host, tokens, rows, want.data());
    ExpectTwin(Get(out), want, 4 * kUlp, Cat("Embed ", DTypeName(type)));
  }
}

TEST_P(BackendConformance, DriftReductions) {
  std::mt19937 rng(11);
  const int64_t rows = 3, l = 29;
  const int heads = 4;
  const int64_t size = rows * heads * l;  // [rows, H, L]
  // Distributions over L, some entries below the KL's floor.
  auto distributions = [&] {
    std::vector<float> p = Random(size, 1.0f, rng);
    for (int64_t r = 0; r < rows * heads; ++r) {
      double total = 0;
      for (int64_t j = 0; j < l; ++j) {
        float& e = p[size_t(r * l + j)];
        e = j % 7 == 3 ? 1e-14f : std::fabs(e);
        total += e;
      }
      for (int64_t j = 0; j < l; ++j) p[size_t(r * l + j)] = float(p[size_t(r * l + j)] / total);
    }
    return p;
  };
  const std::vector<float> now = distributions(), before = distributions();
  const Buffer now_in = Put(now), before_in = Put(before);
  for (const DriftMetric metric : {DriftMetric::kKl, DriftMetric::kCosine}) {
    std::vector<double> got(rows, NAN), want(rows);
    backend().HeadMeanDrift(metric, now_in.data(), before_in.data(), rows, heads, l, got.data());
    reference_.HeadMeanDrift(metric, now.data(), before.data(), rows, heads, l, want.data());
    for (int64_t r = 0; r < rows; ++r) {
      if (exact_) {
        EXPECT_EQ(got[size_t(r)], want[size_t(r)]) << "HeadMeanDrift row " << r;
      } else {
        EXPECT_NEAR(got[size_t(r)], want[size_t(r)], 1e-6 * std::fabs(want[size_t(r)]) + 1e-12);
      }
    }
  }
  // KL with kept logs: now's logs out, then given back as before's: the same drift.
  std::vector<double> first(rows), second(rows), want(rows);
  Buffer logs_out = PutAs(std::vector<double>(size_t(size), NAN), ElementType::kF64);
  backend().HeadMeanDrift(DriftMetric::kKl, now_in.data(), before_in.data(), rows, heads, l,
                          first.data(), {logs_out.As<double>(), nullptr});
  backend().HeadMeanDrift(DriftMetric::kKl, before_in.data(), now_in.data(), rows, heads, l,
                          second.data(), {nullptr, logs_out.As<double>()});
  const std::vector<double> logs = GetAs<double>(logs_out);
  reference_.HeadMeanDrift(DriftMetric::kKl, before.data(), now.data(), rows, heads, l,
                           want.data());
  for (int64_t i = 0; i < size; ++i) {
    ASSERT_NEAR(logs[size_t(i)], std::log(double(std::max(now[size_t(i)], 1e-12f))), 1e-12) << i;
  }
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(second[size_t(r)], want[size_t(r)], exact_ ? 0.0 : 1e-6 * want[size_t(r)])
        << "HeadMeanDrift with before's logs, row " << r;
  }

  const std::vector<int> now_rows = {2, 0};
  const std::vector<float> earlier(before.begin(), before.begin() + 2 * heads * l);
  const Buffer earlier_in = Put(earlier);
  const double cosine =
      backend().MeanCrossHeadCosine(now_in.data(), now_rows, earlier_in.data(), heads, l);
  const double want_cosine =
      reference_.MeanCrossHeadCosine(now.data(), now_rows, earlier.data(), heads, l);
  if (exact_) {
    EXPECT_EQ(cosine, want_cosine);
  } else {
    EXPECT_NEAR(cosine, want_cosine, 1e-6);
  }
}

// The rows of [0, total) that `named` leaves out: where an op must not write, or must not read.
std::vector<int> RowsNotNamed(std::span<const int> named, int64_t total) {
  std::vector<int> rest;
  for (int r = 0; r < int(total); ++r) {
    if (std::ranges::find(named, r) == named.end()) rest.push_back(r);
  }
  return rest;
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Elastic-Cache's key ranking. AttentionMass sums |rows| H probabilities per key in double,
// row by row in the list's order, then head by head: bit for bit on an exact backend, else
// within the |rows| H 2^-53 relative bound another order of those positive terms allows. The
// rows it does not name hold NaN, so reading one shows. TopKeys only compares the masses it
// is given (uploaded here, with ties) and breaks ties by the lower key: exact on every backend.
TEST_P(BackendConformance, AttentionMassAndTopKeys) {
  std::mt19937 rng(12);
  const int heads = 3;
  const int64_t probs_rows = 6, l = 23;
  const std::vector<int> rows = {4, 1, 5};
  std::vector<float> probs = Random(probs_rows * heads * l, 1.0f, rng);  // [6, H, L]
  for (float& p : probs) p = std::fabs(p);
  for (const int r : RowsNotNamed(rows, probs_rows)) {
    std::fill_n(probs.begin() + int64_t(r) * heads * l, heads * l, kNan);
  }
  const Buffer probs_in = Put(probs);
  Buffer mass_out = PutAs(std::vector<double>(size_t(l + 2), kNan), ElementType::kF64);  // [L + 2]
  backend().AttentionMass(probs_in.data(), rows, heads, l, mass_out.As<double>());
  const std::vector<double> mass = GetAs<double>(mass_out);
  std::vector<double> want(static_cast<size_t>(l));  // [L]
  reference_.AttentionMass(probs.data(), rows, heads, l, want.data());
  const double relative = double(rows.size()) * heads * std::numeric_limits<double>::epsilon();
  for (int64_t j = 0; j < l; ++j) {
    ASSERT_TRUE(std::isfinite(want[size_t(j)])) << "the reference read an unnamed row, key " << j;
    if (exact_) {
      ASSERT_EQ(std::bit_cast<uint64_t>(mass[size_t(j)]), std::bit_cast<uint64_t>(want[size_t(j)]))
          << "AttentionMass key " << j << ": " << mass[size_t(j)] << " vs " << want[size_t(j)];
    } else {
      ASSERT_NEAR(mass[size_t(j)], want[size_t(j)], relative * want[size_t(j)])
          << "AttentionMass key " << j;
    }
  }
  ExpectPoisoned(mass, size_t(l), size_t(l + 2), double(kNan), "AttentionMass beyond L");

  // Masses in quarters, so keys tie; keys not in the list outweigh every listed one.
  std::vector<double> ranked(size_t(l), 1e300);  // [L]
  const std::vector<int> keys = {20, 3, 7, 11, 0, 15, 9, 2};
  for (const int key : keys) ranked[size_t(key)] = 0.25 * double(rng() % 4);
  const Buffer ranked_in = PutAs(ranked, ElementType::kF64);
  std::vector<int> top(7, -1), want_top(5, -1);  // |top| = 5, then 2 poisoned
  backend().TopKeys(ranked_in.As<double>(), keys, std::span<int>(top).first(5));
  reference_.TopKeys(ranked.data(), keys, want_top);
  EXPECT_EQ(std::vector<int>(top.begin(), top.begin() + 5), want_top) << "TopKeys";
  ExpectPoisoned(top, 5, 7, -1, "TopKeys beyond |top|");
}

// A stable counting sort moves integers and copies weights: no arithmetic, exact on every
// backend. GatherRows copies rows: exact on every backend.
TEST_P(BackendConformance, GroupByExpertAndGatherRows) {
  std::mt19937 rng(13);
  const std::vector<int64_t> segments = {3, 0, 5, 2};  // S = 4, M = 10
  const int64_t m = 10, sequences = 4;
  const int experts = 6, k = 2;
  // Two distinct experts a row, never expert 4 (an empty group).
  const std::vector<int> choosable = {0, 1, 2, 3, 5};
  std::vector<int> chosen;  // [M, k]
  for (int64_t r = 0; r < m; ++r) {
    const size_t first = rng() % choosable.size();
    const size_t second = (first + 1 + rng() % (choosable.size() - 1)) % choosable.size();
    chosen.push_back(choosable[first]);
    chosen.push_back(choosable[second]);
  }
  const std::vector<float> weights = Random(m * k, 1.0f, rng);  // [M, k]
  const Buffer chosen_in = PutAs(chosen, ElementType::kI32), weights_in = Put(weights);
  // Each output one element (or row) longer than the op names: it must stay poisoned.
  Buffer rows_out = PutAs(std::vector<int>(size_t(m * k + 1), -1), ElementType::kI32);
  Buffer row_weights_out = Poisoned(m * k + 1);
  Buffer counts_out =
      PutAs(std::vector<int>(size_t(sequences * experts + 1), -1), ElementType::kI32);
  Buffer slots_out = PutAs(std::vector<int>(size_t(m * k + 1), -1), ElementType::kI32);
  backend().GroupByExpert(chosen_in.As<int>(), weights_in.data(), segments, experts, k,
                          rows_out.As<int>(), row_weights_out.data(), counts_out.As<int>(),
                          slots_out.As<int>());
  std::vector<int> want_rows(size_t(m * k + 1), -1),
      want_counts(size_t(sequences * experts + 1), -1), want_slots(size_t(m * k + 1), -1);
  std::vector<float> want_weights(size_t(m * k + 1), kNan);
  reference_.GroupByExpert(chosen.data(), weights.data(), segments, experts, k, want_rows.data(),
                           want_weights.data(), want_counts.data(), want_slots.data());
  EXPECT_EQ(GetAs<int>(rows_out), want_rows) << "GroupByExpert rows";
  EXPECT_EQ(GetAs<int>(counts_out), want_counts) << "GroupByExpert counts";
  EXPECT_EQ(GetAs<int>(slots_out), want_slots) << "GroupByExpert slots";
  ExpectExact(Get(row_weights_out), want_weights, "GroupByExpert row weights");
  for (int64_t s = 0; s < sequences; ++s) {
    EXPECT_EQ(want_counts[size_t(s * experts + 4)], 0) << "expert 4 was never chosen";
  }

  const int64_t width = 19;
  const std::vector<float> src = Random(6 * width, 2.0f, rng);  // [6, width]
  const std::vector<int> gathered = {5, 0, 5, 2};               // a row twice
  const Buffer src_in = Put(src), gathered_in = PutAs(gathered, ElementType::kI32);
  const int64_t n = int64_t(gathered.size());
  Buffer dst = Poisoned((n + 1) * width);  // [n + 1, width]
  backend().GatherRows(src_in.data(), gathered_in.As<int>(), n, dst.data(), width);
  std::vector<float> want(size_t((n + 1) * width), kNan);
  reference_.GatherRows(src.data(), gathered.data(), n, want.data(), width);
  const std::vector<float> got = Get(dst);
  ExpectExact(got, want, "GatherRows");
  ExpectPoisoned(got, size_t(n * width), got.size(), kNan, "GatherRows beyond n rows");
}

// Polestar's clustering. The points lie in k orthogonal cones, ordered so the seeds (points
// c n / k) fall in distinct cones: every label wins by a margin far beyond rounding, so the
// labels are exact on every backend. The centroids are the members' means, summed in double:
// bit for bit on an exact backend, else within the 2 (n + 2) 2^-24 of the largest coordinate a
// float sum in another order allows. With n <= k the centroids copy the points: exact.
TEST_P(BackendConformance, SphericalKMeans) {
  std::mt19937 rng(14);
  const int64_t d = 32;
  const int k = 4;
  for (const int64_t n : {int64_t(40), int64_t(3)}) {
    std::vector<float> points = Random(n * d, 0.3f, rng);  // [n, d]
    std::vector<int> cones(static_cast<size_t>(n));        // [n]
    for (int64_t i = 0; i < n; ++i) {
      const int64_t cone = cones[size_t(i)] = int((i + i / std::max<int64_t>(n / k, 1)) % k);
      for (int64_t j = cone * d / k; j < (cone + 1) * d / k; ++j) points[size_t(i * d + j)] += 2.0f;
    }
    const Buffer points_in = Put(points);
    Buffer centroids_out = Poisoned((k + 1) * d);  // [k + 1, d]
    Buffer labels_out = PutAs(std::vector<int>(size_t(n + 1), -1), ElementType::kI32);  // [n + 1]
    backend().SphericalKMeans(points_in.data(), n, d, k, 6, centroids_out.data(),
                              labels_out.As<int>());
    std::vector<float> want_centroids(size_t((k + 1) * d), kNan);
    std::vector<int> want_labels(size_t(n + 1), -1);
    reference_.SphericalKMeans(points.data(), n, d, k, 6, want_centroids.data(),
                               want_labels.data());
    const std::string label = Cat("SphericalKMeans n=", n);
    if (n > k) {  // the premise of exact labels: cluster c is the cone of its seed, point c n / k
      std::vector<int> cluster_of_cone(static_cast<size_t>(k));  // [k]
      for (int c = 0; c < k; ++c) cluster_of_cone[size_t(cones[size_t(c * n / k)])] = c;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(want_labels[size_t(i)], cluster_of_cone[size_t(cones[size_t(i)])])
            << label << " point " << i;
      }
    }
    EXPECT_EQ(GetAs<int>(labels_out), want_labels) << label << " labels";
    const std::vector<float> centroids = Get(centroids_out);
    const double largest =
        std::fabs(std::ranges::max(points, {}, [](float x) { return std::fabs(x); }));
    const bool copies = n <= k;
    ExpectClose(
        std::vector<float>(centroids.begin(), centroids.begin() + k * d),
        std::vector<float>(want_centroids.begin(), want_centroids.begin() + k * d),
        [&](size_t) { return exact_ || copies ? 0.0 : 2.0 * double(n + 2) * kUlp * largest; },
        label + " centroids");
    ExpectPoisoned(centroids, size_t(k * d), centroids.size(), kNan, label + " beyond k");
  }
  // Points of width 0 (a layer whose drift rows are empty) are a call, not an error: every
  // similarity is 0, so cluster 0 wins every tie, and the centroids have nothing to write.
  // The one-element buffers stand in for empty ones; the poison shows a write.
  const int64_t n = 10;
  const Buffer points_in = Put({7.0f});
  Buffer centroids_out = Poisoned(1);
  Buffer labels_out = PutAs(std::vector<int>(size_t(n + 1), -1), ElementType::kI32);  // [n + 1]
  backend().SphericalKMeans(points_in.data(), n, 0, k, 6, centroids_out.data(),
                            labels_out.As<int>());
  std::vector<int> want_labels(size_t(n), 0);
  want_labels.push_back(-1);
  EXPECT_EQ(GetAs<int>(labels_out), want_labels) << "SphericalKMeans d=0 labels";
  ExpectPoisoned(Get(centroids_out), 0, 1, kNan, "SphericalKMeans d=0 centroids");
}

// The centroid shift: per moved cluster a double sum of the pairs' now - before over members
// + 1e-6, added to the float centroid. Bit for bit on an exact backend, else within one
// rounding of the result plus 2 (pairs + 2) 2^-24 of the cluster's sum of |now - before| over
// its members (a float sum in another order). Clusters no pair names, or with no members,
// keep their bits on every backend; the now rows no pair names hold NaN, so reading one shows.
TEST_P(BackendConformance, ShiftCentroids) {
  std::mt19937 rng(15);
  const int64_t width = 21, now_count = 6;
  const std::vector<int> now_rows = {4, 0, 2, 5}, labels = {1, 3, 1, 2};
  const std::vector<float> members = {4, 2, 0, 1, 7};  // [K]: cluster 2 named, but empty
  const int64_t clusters = int64_t(members.size());
  std::vector<float> now = Random(now_count * width, 2.0f, rng);  // [6, width]
  for (const int r : RowsNotNamed(now_rows, now_count)) {
    std::fill_n(now.begin() + r * width, width, kNan);
  }
  const std::vector<float> before = Random(int64_t(now_rows.size()) * width, 2.0f, rng);
  const std::vector<float> initial = Random(clusters * width, 1.0f, rng);  // [K, width]
  const Buffer now_in = Put(now), before_in = Put(before);
  Buffer centroids = Put(initial);
  backend().ShiftCentroids(now_in.data(), now_rows, before_in.data(), labels, members, width,
                           centroids.data());
  std::vector<float> want = initial;
  reference_.ShiftCentroids(now.data(), now_rows, before.data(), labels, members, width,
                            want.data());
  const std::vector<float> got = Get(centroids);
  std::vector<double> moved(size_t(clusters * width), 0.0);  // [K, width] sum |now - before|
  for (size_t i = 0; i < now_rows.size(); ++i) {
    for (int64_t j = 0; j < width; ++j) {
      moved[size_t(labels[i] * width + j)] += std::fabs(
          double(now[size_t(now_rows[i] * width + j)]) - before[i * size_t(width) + size_t(j)]);
    }
  }
  ExpectClose(
      got, want,
      [&](size_t i) {
        const size_t c = i / size_t(width);
        if (exact_ || members[c] <= 0) return 0.0;
        return 2 * kUlp * std::fabs(want[i]) +
               2.0 * double(now_rows.size() + 2) * kUlp * moved[i] / members[c] + 1e-30;
      },
      "ShiftCentroids");
  for (const int c : {0, 2, 4}) {  // not named, named but empty, not named
    ExpectExact(std::vector<float>(got.begin() + c * width, got.begin() + (c + 1) * width),
                std::vector<float>(initial.begin() + c * width, initial.begin() + (c + 1) * width),
                Cat("ShiftCentroids keeps cluster ", c));
  }
  ASSERT_NE(got[size_t(width)], initial[size_t(width)]) << "cluster 1 did not move";
}

// Polestar's NVFP4 store of residuals x - base. The tensor amax is one subtraction, |.| and
// max per element, and the codes are round-to-nearest of correctly rounded IEEE quotients:
// both exact on every backend (with random inputs no quotient lands on a code's rounding
// boundary, the one place another division order could round across). Dequantising is a
// code times a scale times the tensor scale plus the base: bit for bit on an exact backend,
// else within two roundings. Rows of x and store rows no list names hold NaN (0xff is
// E4M3's NaN), so reading one shows; store and output rows no list names stay poisoned.
TEST_P(BackendConformance, Nvfp4ResidualStore) {
  std::mt19937 rng(16);
  const int64_t width = 37;  // three blocks, the last partial; an odd count of codes
  const int64_t x_count = 5, store_count = 4, out_count = 5;
  const std::vector<int> x_rows = {3, 0, 4}, labels = {2, 0, 2}, store_rows = {2, 0, 3};
  std::vector<float> x = Random(x_count * width, 3.0f, rng);  // [5, width]
  for (const int r : RowsNotNamed(x_rows, x_count)) std::fill_n(x.begin() + r * width, width, kNan);
  const std::vector<float> base = Random(3 * width, 3.0f, rng);  // [3, width]
  const Buffer x_in = Put(x), base_in = Put(base);

  Buffer amax_out = Poisoned(2);
  backend().ResidualAbsMax(x_in.data(), x_rows, base_in.data(), labels, width, amax_out.data());
  float want_amax = kNan;
  reference_.ResidualAbsMax(x.data(), x_rows, base.data(), labels, width, &want_amax);
  const std::vector<float> amax = Get(amax_out);
  ExpectExact({amax[0]}, {want_amax}, "ResidualAbsMax");
  ExpectPoisoned(amax, 1, 2, kNan, "ResidualAbsMax beyond amax[1]");
  ASSERT_TRUE(std::isfinite(want_amax) && want_amax > 0) << "the reference read an unnamed row";

  const float tensor_scale = Nvfp4TensorScale(want_amax);
  const int64_t scale_bytes = Nvfp4ScaleBytes(width), value_bytes = Nvfp4ValueBytes(width);
  std::vector<uint8_t> want_scales(size_t(store_count * scale_bytes), 0xff);  // [4, 3]
  std::vector<uint8_t> want_values(size_t(store_count * value_bytes), 0xff);  // [4, 19]
  Buffer scales = PutAs(want_scales, ElementType::kU8),
         values = PutAs(want_values, ElementType::kU8);
  backend().QuantizeResiduals(x_in.data(), x_rows, base_in.data(), labels, width, tensor_scale,
                              scales.As<uint8_t>(), values.As<uint8_t>(), store_rows);
  reference_.QuantizeResiduals(x.data(), x_rows, base.data(), labels, width, tensor_scale,
                               want_scales.data(), want_values.data(), store_rows);
  const std::vector<uint8_t> got_scales = GetAs<uint8_t>(scales),
                             got_values = GetAs<uint8_t>(values);
  EXPECT_EQ(got_scales, want_scales) << "QuantizeResiduals block scales";
  EXPECT_EQ(got_values, want_values) << "QuantizeResiduals codes";
  ExpectPoisoned(got_scales, size_t(scale_bytes), size_t(2 * scale_bytes), uint8_t(0xff),
                 "QuantizeResiduals store row 1's scales");
  ExpectPoisoned(got_values, size_t(value_bytes), size_t(2 * value_bytes), uint8_t(0xff),
                 "QuantizeResiduals store row 1's codes");

  // Back out of the backend's store (row 1 never written: its NaN scales), onto other bases.
  const std::vector<int> read_rows = {0, 3, 2}, read_labels = {1, 2, 0}, out_rows = {4, 1, 0};
  Buffer out = Poisoned(out_count * width);  // [5, width]
  backend().DequantizeResiduals(scales.As<uint8_t>(), values.As<uint8_t>(), read_rows,
                                base_in.data(), read_labels, width, tensor_scale, out.data(),
                                out_rows);
  std::vector<float> want(size_t(out_count * width), kNan);
  reference_.DequantizeResiduals(got_scales.data(), got_values.data(), read_rows, base.data(),
                                 read_labels, width, tensor_scale, want.data(), out_rows);
  const std::vector<float> got = Get(out);
  for (size_t i = 0; i < out_rows.size(); ++i) {
    const int64_t row = out_rows[i], base_row = read_labels[i];
    const std::vector<float> want_row(want.begin() + row * width, want.begin() + (row + 1) * width);
    ExpectClose(
        std::vector<float>(got.begin() + row * width, got.begin() + (row + 1) * width), want_row,
        [&](size_t j) {
          const double residual = want_row[j] - double(base[size_t(base_row * width) + j]);
          return exact_ ? 0.0 : 2 * kUlp * (std::fabs(residual) + std::fabs(want_row[j])) + 1e-30;
        },
        Cat("DequantizeResiduals out row ", row));
  }
  for (const int r : RowsNotNamed(out_rows, out_count)) {
    ExpectPoisoned(got, size_t(r * width), size_t((r + 1) * width), kNan,
                   Cat("DequantizeResiduals out row ", r));
  }
}

// The greedy choice per row, for every confidence kind, with and without an excluded token
// (in row 1 the excluded token has the largest logit), and rows with non-finite logits (then
// only non_finite means anything). Bit for bit on an exact backend. Else: the token exactly
// where the two best candidates' logits differ by more than 1e-3 (not a tie a rounding could
// flip); the float64 softmax probability within 1e-12 relative (a double sum of V terms); the
// fp32 kinds within 4 (V + 8) 2^-24 of max(1, |confidence|) (a float sum of V terms, an exp
// and a division each; the margin's and the entropy's terms are each within that of the
// probabilities). The element past the M rows stays poisoned.
TEST_P(BackendConformance, GreedyChoices) {
  std::mt19937 rng(17);
  const int64_t m = 6, vocab = 90;
  std::vector<float> logits = Random(m * vocab, 4.0f, rng);  // [M, V]
  logits[size_t(1 * vocab + 7)] = 10.0f;
  logits[size_t(3 * vocab + 30)] = kNan;
  logits[size_t(3 * vocab + 50)] = std::numeric_limits<float>::infinity();
  logits[size_t(4 * vocab + 12)] = -std::numeric_limits<float>::infinity();
  const Buffer logits_in = Put(logits);
  const GreedyChoice poison{.token = -1, .non_finite = -7.0f, .confidence = kNan};
  for (const GreedyConfidence kind :
       {GreedyConfidence::kNone, GreedyConfidence::kFloat64Softmax,
        GreedyConfidence::kFp32Probability, GreedyConfidence::kFp32Margin,
        GreedyConfidence::kFp32NegEntropy}) {
    for (const int excluded : {-1, 7}) {
      const GreedySpec spec{.confidence = kind, .excluded = excluded};
      std::vector<GreedyChoice> got(size_t(m + 1), poison), want(size_t(m), poison);
      backend().GreedyChoices(logits_in.data(), m, vocab, spec, got.data());
      reference_.GreedyChoices(logits.data(), m, vocab, spec, want.data());
      for (int64_t r = 0; r < m; ++r) {
        const GreedyChoice& g = got[size_t(r)];
        const GreedyChoice& w = want[size_t(r)];
        const std::string label =
            Cat("GreedyChoices kind ", int(kind), " excluded ", excluded, " row ", r);
        if (w.non_finite != 0) {
          EXPECT_TRUE(g.non_finite == w.non_finite ||
                      (std::isnan(g.non_finite) && std::isnan(w.non_finite)))
              << label << ": non_finite " << g.non_finite << " vs " << w.non_finite;
          if (exact_) {
            EXPECT_EQ(std::bit_cast<uint32_t>(g.non_finite), std::bit_cast<uint32_t>(w.non_finite))
                << label;
          }
          continue;
        }
        EXPECT_EQ(std::bit_cast<uint32_t>(g.non_finite), 0u) << label << ": non_finite written";
        if (exact_) {
          EXPECT_EQ(g.token, w.token) << label;
          EXPECT_EQ(std::bit_cast<uint64_t>(g.confidence), std::bit_cast<uint64_t>(w.confidence))
              << label << ": " << g.confidence << " vs " << w.confidence;
          continue;
        }
        // The two best candidates' logits (the excluded token is no candidate).
        float best = -INFINITY, second = -INFINITY;
        for (int64_t t = 0; t < vocab; ++t) {
          if (t == excluded) continue;
          const float v = logits[size_t(r * vocab + t)];
          second = std::max(second, std::min(best, v));
          best = std::max(best, v);
        }
        if (best - second > 1e-3f) {
          EXPECT_EQ(g.token, w.token) << label;
        }
        const double allowed =
            kind == GreedyConfidence::kFloat64Softmax
                ? 1e-12 * std::fabs(w.confidence)
                : 4.0 * double(vocab + 8) * kUlp * std::max(1.0, std::fabs(w.confidence));
        EXPECT_NEAR(g.confidence, w.confidence, allowed) << label;
      }
      const GreedyChoice& tail = got[size_t(m)];
      EXPECT_TRUE(tail.token == -1 && tail.non_finite == -7.0f && std::isnan(tail.confidence))
          << "GreedyChoices wrote past its M rows";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendConformance, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace polestar
