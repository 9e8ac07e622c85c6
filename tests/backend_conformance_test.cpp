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
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/registry.h"
#include "base/dtype.h"
#include "base/error.h"
#include "ops/quant.h"

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
  std::string name = info.param.spec;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
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
    const std::string name = GetParam().spec.substr(0, GetParam().spec.find(':'));
    for (const BackendEntry& entry : RegisteredBackends()) {
      if (entry.name != name) continue;
      if (const std::string why = entry.unavailable(); !why.empty()) {
        GTEST_SKIP() << "backend '" << name << "' cannot run here: " << why;
      }
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

  // The reference: the scalar kernels, on host memory, with the case's activation precision.
  const CpuBackend reference_{Isa::kScalar, GetParam().activations};
  const Backend* backend_ = nullptr;
  bool exact_ = false;
};

// The bound on one output of x[M, K] · w[N, K]^T against the scalar product: summation order
// (2 (K + 1) u of sum |x w|), and with reduced activations the rounding a backend may apply
// that the scalar twin does not (BF16 activations for BF16 weights: 2^-8 of sum |x w|).
double ProductBound(const Weights& w, const ActivationPrecision activations, const float* x,
                    int64_t n) {
  const int64_t k = w.host.cols;
  double magnitude = 0;
  for (int64_t t = 0; t < k; ++t)
    magnitude += std::fabs(double(x[t]) * w.values[size_t(n * k + t)]);
  double relative = 2.0 * double(k + 1) * kUlp;
  if (activations == ActivationPrecision::kReduced && w.host.dtype == DType::kBF16) {
    relative += std::ldexp(1.0, -8);
  }
  return relative * magnitude + 1e-30;
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
                return ProductBound(w, GetParam().activations, &x[i / n * k], int64_t(i % n));
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
          return ProductBound(w, GetParam().activations, &x[i / n * k], int64_t(i % n));
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
          const double product = ProductBound(lm_head, GetParam().activations,
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
  const int heads = 6, kv_heads = 2, head_dim = 24;
  const int64_t m = 5, l = 37;
  const std::vector<float> q = Random(m * heads * head_dim, 1.0f, rng);
  const std::vector<float> k = Random(l * kv_heads * head_dim, 1.0f, rng);
  const std::vector<float> v = Random(l * kv_heads * head_dim, 1.0f, rng);
  const Buffer q_in = Put(q), k_in = Put(k), v_in = Put(v);
  Buffer out = Poisoned(m * heads * head_dim), probs = Poisoned(m * heads * l);
  backend().Attention(q_in.data(), m, k_in.data(), v_in.data(), l, heads, kv_heads, head_dim,
                      out.data(), probs.data());
  std::vector<float> want_out(size_t(m * heads * head_dim)), want_probs(size_t(m * heads * l));
  reference_.Attention(q.data(), m, k.data(), v.data(), l, heads, kv_heads, head_dim,
                       want_out.data(), want_probs.data());
  // Scores of |q k| <= D summed in another order, the softmax's exp and total, and L
  // weighted values: within 1e-5 for these magnitudes (ops_test derives the per-element
  // bound), the probabilities within 1e-6.
  ExpectClose(
      Get(out), want_out, [](size_t) { return 1e-5; }, "Attention out");
  ExpectClose(
      Get(probs), want_probs, [](size_t) { return 1e-6; }, "Attention probs");
  Buffer no_probs = Poisoned(m * heads * head_dim);
  backend().Attention(q_in.data(), m, k_in.data(), v_in.data(), l, heads, kv_heads, head_dim,
                      no_probs.data());
  ExpectExact(Get(no_probs), Get(out), "Attention without probabilities, against with");

  // The drift measurements' probabilities: the scalar kernel's bits on an exact backend.
  Buffer alone = Poisoned(m * heads * l);
  backend().AttentionProbabilities(q_in.data(), m, k_in.data(), l, heads, kv_heads, head_dim,
                                   alone.data());
  std::vector<float> want_alone(size_t(m * heads * l));
  reference_.AttentionProbabilities(q.data(), m, k.data(), l, heads, kv_heads, head_dim,
                                    want_alone.data());
  ExpectTwin(Get(alone), want_alone, 1e-5, "AttentionProbabilities");
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

TEST_P(BackendConformance, RowCopiesScaleAddAndEmbed) {
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

  // dst row to[i] += scales[i] * src row i: one product and one sum each.
  const std::vector<float> scales = {0.5f, -1.25f, 3.0f};
  Buffer accumulated = Put(background);
  const Buffer scales_in = Put(scales), to_in = PutAs(to, ElementType::kI32);
  backend().ScaleAddRows(src_in.data(), scales_in.data(), accumulated.data(), to_in.As<int>(),
                         int64_t(to.size()), width);
  std::vector<float> accumulated_want = background;
  reference_.ScaleAddRows(src.data(), scales.data(), accumulated_want.data(), to.data(),
                          int64_t(to.size()), width);
  ExpectTwin(Get(accumulated), accumulated_want, 4 * kUlp, "ScaleAddRows");

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

INSTANTIATE_TEST_SUITE_P(Registered, BackendConformance, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace polestar
