// Tests of the trainer: every layer's hand-written backward against central finite
// differences, the whole model's gradient, exact resume, the tokenizer and the export; and
// that no run destroys another's work (a refused folder, a bad checkpoint or loss log, a
// diverged step).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/parallel.h"
#include "io/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "tasks/tasks.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe.h"
#include "train/layers.h"
#include "train/tiny_model.h"
#include "train/trainer.h"

namespace polestar::train {
namespace {

std::vector<float> RandomVector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(engine);
  return v;
}

// Checks d loss / d values[i] == analytic[i] by central differences in fp32, for every
// `stride`-th i.
void ExpectGradient(std::vector<float>& values, const std::vector<float>& analytic,
                    const std::function<double()>& loss, float step, float tolerance,
                    const std::string& what, size_t stride = 1) {
  ASSERT_EQ(values.size(), analytic.size());
  for (size_t i = 0; i < values.size(); i += stride) {
    const float saved = values[i];
    values[i] = saved + step;
    const double up = loss();
    values[i] = saved - step;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * step);
    ASSERT_NEAR(analytic[i], numeric, tolerance * (1.0 + std::abs(numeric)))
        << what << " element " << i;
  }
}

TinyConfig SmallConfig() {
  TinyConfig c;
  c.vocab = 23;
  c.width = 8;
  c.layers = 2;
  c.heads = 2;
  c.ffn = 12;
  c.max_positions = 32;
  c.mask_id = 22;
  c.eos_id = 21;
  c.pad_id = 21;
  return c;
}

Batch SmallBatch() {
  Batch b;
  b.tokens = {1, 5, 22, 7, 22, 3, 9, 22, 22, 2, 21, 22};
  b.starts = {0, 5, 12};
  b.positions = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6};
  b.target_rows = {2, 4, 7, 8, 11};
  b.targets = {4, 6, 10, 21, 21};
  b.weights = {0.5f, 0.5f, 0.25f, 0.25f, 0.25f};
  return b;
}

TEST(TrainModelTest, WholeModelGradientMatchesFiniteDifferences) {
  TinyModel model(SmallConfig());
  model.Init(7);
  // Norm weights away from 1 so their gradients are exercised off the trivial point.
  std::vector<float>& p = model.params();
  const std::vector<float> noise = RandomVector(p.size(), 11, 0.3f);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  const Batch batch = SmallBatch();
  std::vector<float> grads(p.size(), 0.0f);
  model.Run(batch, grads.data());
  // A third of the elements, spread over every tensor.
  ExpectGradient(
      p, grads, [&] { return model.Run(batch, nullptr); }, 1e-2f, 2e-2f, "model", 3);
}

// Loss = sum(r * y) for a fixed random r, so dL/dy = r.
double Weighted(const std::vector<float>& y, const std::vector<float>& r) {
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += double(y[i]) * r[i];
  return sum;
}

TEST(TrainLayerTest, LinearBackward) {
  const int64_t m = 3, k = 5, n = 4;
  std::vector<float> x = RandomVector(m * k, 1), w = RandomVector(n * k, 2),
                     r = RandomVector(m * n, 3);
  std::vector<float> y(m * n), dx(m * k), dw(n * k, 0.0f);
  auto loss = [&] {
    LinearForward(x.data(), m, k, w.data(), n, y.data());
    return Weighted(y, r);
  };
  LinearBackward(r.data(), x.data(), w.data(), m, k, n, dx.data(), dw.data());
  ExpectGradient(x, dx, loss, 1e-2f, 1e-3f, "dx");
  ExpectGradient(w, dw, loss, 1e-2f, 1e-3f, "dw");
  // Accumulating variants add to what is there.
  std::vector<float> dx2(dx), dw2(dw);
  LinearBackward(r.data(), x.data(), w.data(), m, k, n, dx2.data(), dw2.data(), true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw[i]);
}

// Enough rows and outputs that ParallelFor splits the products over two threads: the pieces
// must still give the plain sums, as the unsplit product at one thread does.
TEST(TrainLayerTest, LinearSplitOverThreadsEqualsThePlainSums) {
  const int64_t m = 300, k = 24, n = 40;
  const std::vector<float> x = RandomVector(m * k, 4), w = RandomVector(n * k, 5),
                           dy = RandomVector(m * n, 6);
  auto run = [&](int threads, std::vector<float>& y, std::vector<float>& dx,
                 std::vector<float>& dw) {
    polestar::SetThreadCount(threads);
    y.assign(size_t(m * n), 0.0f);
    dx.assign(size_t(m * k), 0.0f);
    dw.assign(size_t(n * k), 0.0f);
    LinearForward(x.data(), m, k, w.data(), n, y.data());
    LinearBackward(dy.data(), x.data(), w.data(), m, k, n, dx.data(), dw.data());
  };
  std::vector<float> y1, dx1, dw1, y2, dx2, dw2;
  run(1, y1, dx1, dw1);
  run(2, y2, dx2, dw2);
  polestar::SetThreadCount(0);
  for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], y2[i], 1e-4);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += double(x[size_t(r * k + i)]) * w[size_t(c * k + i)];
      ASSERT_NEAR(y2[size_t(r * n + c)], sum, 1e-4) << r << "," << c;
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t i = 0; i < k; ++i) {
      double sum = 0;
      for (int64_t r = 0; r < m; ++r) sum += double(dy[size_t(r * n + c)]) * x[size_t(r * k + i)];
      ASSERT_NEAR(dw2[size_t(c * k + i)], sum, 1e-3) << c << "," << i;
    }
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      double sum = 0;
      for (int64_t c = 0; c < n; ++c) sum += double(dy[size_t(r * n + c)]) * w[size_t(c * k + i)];
      ASSERT_NEAR(dx2[size_t(r * k + i)], sum, 1e-4) << r << "," << i;
    }
  }
}

TEST(TrainLayerTest, RmsNormBackward) {
  const int64_t m = 4, c = 6;
  std::vector<float> x = RandomVector(m * c, 4), w = RandomVector(c, 5), r = RandomVector(m * c, 6);
  std::vector<float> y(m * c), inv(m), dx(m * c, 0.0f), dw(c, 0.0f);
  auto loss = [&] {
    RmsNormForward(x.data(), m, c, w.data(), 1e-5f, y.data(), inv.data());
    return Weighted(y, r);
  };
  loss();
  // Forward against the definition.
  for (int64_t row = 0; row < m; ++row) {
    double ss = 0.0;
    for (int64_t i = 0; i < c; ++i) ss += double(x[row * c + i]) * x[row * c + i];
    const double scale = 1.0 / std::sqrt(ss / c + 1e-5);
    for (int64_t i = 0; i < c; ++i)
      EXPECT_NEAR(y[row * c + i], x[row * c + i] * scale * w[i], 1e-5);
  }
  RmsNormBackward(r.data(), x.data(), w.data(), inv.data(), m, c, dx.data(), dw.data());
  ExpectGradient(x, dx, loss, 1e-2f, 2e-3f, "dx");
  ExpectGradient(w, dw, loss, 1e-2f, 2e-3f, "dw");
}

TEST(TrainLayerTest, RopeBackwardIsInverseRotation) {
  const int heads = 2, head_dim = 4;
  const int64_t m = 3, stride = 10;  // rows wider than heads * D: the rest is untouched
  const RopeTable table(head_dim, head_dim, 16, 10000.0f);
  const std::vector<int> positions = {0, 5, 11};
  std::vector<float> x = RandomVector(m * stride, 7), r = RandomVector(m * stride, 8);
  auto loss = [&] {
    std::vector<float> y = x;
    Rope(y.data(), m, stride, heads, positions, table, false);
    return Weighted(y, r);
  };
  std::vector<float> dx = r;
  Rope(dx.data(), m, stride, heads, positions, table, true);
  ExpectGradient(x, dx, loss, 1e-2f, 1e-3f, "dx");
  // Agrees with the engine's rotation on contiguous rows.
  std::vector<float> a = RandomVector(m * heads * head_dim, 9), b = a;
  Rope(a.data(), m, heads * head_dim, heads, positions, table, false);
  ApplyRope(b.data(), positions, heads, table, false);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(a[i], b[i]);
}

TEST(TrainLayerTest, AttentionBackward) {
  const int heads = 2, head_dim = 4;
  const std::vector<int> starts = {0, 3, 8};  // two sequences, attention stays inside each
  const int64_t m = 8, width = heads * head_dim;
  std::vector<float> qkv = RandomVector(m * 3 * width, 10), r = RandomVector(m * width, 11);
  std::vector<float> out(m * width), probs(AttentionProbsSize(starts, heads)), dqkv(m * 3 * width);
  auto loss = [&] {
    AttentionForward(qkv.data(), starts, heads, head_dim, out.data(), probs.data());
    return Weighted(out, r);
  };
  loss();
  // The first sequence's output does not depend on the second sequence's keys.
  std::vector<float> before(out.begin(), out.begin() + 3 * width);
  qkv[5 * 3 * width + width] += 1.0f;
  loss();
  for (int64_t i = 0; i < 3 * width; ++i) EXPECT_EQ(out[i], before[i]);
  qkv[5 * 3 * width + width] -= 1.0f;
  loss();
  AttentionBackward(r.data(), qkv.data(), probs.data(), starts, heads, head_dim, dqkv.data());
  ExpectGradient(qkv, dqkv, loss, 1e-2f, 2e-3f, "dqkv");
}

TEST(TrainLayerTest, SwigluBackward) {
  const int64_t m = 3, f = 5;
  std::vector<float> gu = RandomVector(m * 2 * f, 12, 2.0f), r = RandomVector(m * f, 13);
  std::vector<float> act(m * f), dgu(m * 2 * f);
  auto loss = [&] {
    SwigluForward(gu.data(), m, f, act.data());
    return Weighted(act, r);
  };
  loss();
  EXPECT_NEAR(act[0], gu[0] / (1 + std::exp(-gu[0])) * gu[f], 1e-6);
  SwigluBackward(r.data(), gu.data(), m, f, dgu.data());
  ExpectGradient(gu, dgu, loss, 1e-2f, 2e-3f, "dgu");
}

TEST(TrainLayerTest, CrossEntropyBackward) {
  const int64_t rows = 3, vocab = 7;
  std::vector<float> logits = RandomVector(rows * vocab, 14, 3.0f), dlogits(rows * vocab);
  const std::vector<int> targets = {2, 0, 6};
  const std::vector<float> weights = {1.0f, 0.5f, 2.0f};
  auto loss = [&] {
    std::vector<float> scratch(rows * vocab);
    return CrossEntropy(logits.data(), rows, vocab, targets, weights, scratch.data());
  };
  // Hand value of the first row's term.
  double lse = 0.0;
  for (int64_t i = 0; i < vocab; ++i) lse += std::exp(double(logits[i]));
  const double first = std::log(lse) - logits[2];
  std::vector<float> one(logits.begin(), logits.begin() + vocab), d(vocab);
  EXPECT_NEAR(
      CrossEntropy(one.data(), 1, vocab, {targets.data(), 1}, {weights.data(), 1}, d.data()), first,
      1e-5);
  CrossEntropy(logits.data(), rows, vocab, targets, weights, dlogits.data());
  ExpectGradient(logits, dlogits, loss, 1e-2f, 2e-3f, "dlogits");
}

TEST(TrainModelTest, ExportedModelGivesTheSameLogitsInTheEngine) {
  TinyConfig config = SmallConfig();
  config.width = 16;
  config.heads = 2;
  TinyModel model(config);
  model.Init(3);
  const std::string dir = testing::TempDir();
  model.Export(dir);
  auto loaded = Model::Load(dir);
  EXPECT_EQ(loaded->config().mask_id, config.mask_id);
  EXPECT_EQ(loaded->config().eos_id, config.eos_id);
  EXPECT_EQ(loaded->ParameterCount(), model.ParameterCount());

  const std::vector<int> tokens = {1, 5, 9, 22, 22, 3, 21, 22, 0};
  const int length = int(tokens.size());
  Batch batch;
  batch.tokens = tokens;
  batch.starts = {0, length};
  batch.positions.resize(tokens.size());
  std::iota(batch.positions.begin(), batch.positions.end(), 0);
  batch.target_rows = batch.positions;
  batch.targets.assign(tokens.size(), 0);
  batch.weights.assign(tokens.size(), 1.0f);
  std::vector<float> ours;
  model.Run(batch, nullptr, &ours);

  KvCache cache = MakeCache(*loaded, length, false);
  Forward forward(*loaded, cache);
  StepPlan plan;
  plan.input_rows = batch.positions;
  plan.logit_rows = batch.positions;
  const StepResult result = forward.Run(tokens, plan);
  ASSERT_EQ(result.logits.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_NEAR(result.logits[i], ours[i], 1e-5) << i;
}

TEST(TrainModelTest, ConfigHasLladaKeys) {
  const nlohmann::json ours = SmallConfig().LladaJson();
  const nlohmann::json reference =
      nlohmann::json::parse(std::ifstream(testing::FixtureDir("llada-probe") + "/config.json"));
  for (const auto& [key, value] : reference.items()) EXPECT_TRUE(ours.contains(key)) << key;
  for (const auto& [key, value] : ours.items()) EXPECT_TRUE(reference.contains(key)) << key;
}

TrainOptions TinyRun(const std::string& dir, int steps) {
  TrainOptions o;
  o.out_dir = dir;
  o.layers = 1;
  o.width = 16;
  o.heads = 2;
  o.ffn = 24;
  o.bpe_merges = 20;
  o.tasks = {"add", "copy"};
  o.gen_length = 64;  // with 20 merges a list of names is nearly one token per byte
  o.batch = 4;
  o.steps = steps;
  o.warmup = 2;
  o.seed = 5;
  o.quiet = true;
  o.threads = 1;  // tiny matrices: threads would only wait on each other
  return o;
}

TEST(TrainerTest, ResumeEqualsUninterrupted) {
  const std::string dir = testing::TempDir();
  std::vector<float> straight;
  {
    Trainer trainer(TinyRun(dir + "/straight", 5));
    for (int i = 0; i < 5; ++i) trainer.Step();
    straight = trainer.model().params();
  }
  {
    Trainer first(TinyRun(dir + "/split", 5));
    for (int i = 0; i < 3; ++i) first.Step();
    first.SaveCheckpoint();
  }
  TrainOptions resumed = TinyRun(dir + "/split", 5);
  resumed.resume = true;
  Trainer second(resumed);
  EXPECT_EQ(second.step(), 3);
  for (int i = 0; i < 2; ++i) second.Step();
  const std::vector<float>& params = second.model().params();
  ASSERT_EQ(params.size(), straight.size());
  for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params[i], straight[i]) << i;

  // A warm start takes the parameters and starts the schedule afresh; it needs the source
  // run's tokenizer (exported with its model).
  TrainOptions warm = TinyRun(dir + "/warm", 5);
  warm.init_from = dir + "/split";
  warm.seed = 6;
  EXPECT_THROW(Trainer{warm}, Error);  // nothing exported there yet
  Trainer(TinyRun(dir + "/split", 5)).ExportModel();
  Trainer third(warm);
  EXPECT_EQ(third.step(), 0);
  std::vector<float> after_three;
  {
    TrainOptions again = TinyRun(dir + "/split", 5);
    again.resume = true;
    after_three = Trainer(again).model().params();
  }
  EXPECT_EQ(third.model().params(), after_three);

  // It keeps the source's tokenizer even when this run's own tasks would learn other merges
  // (task texts may change between stages).
  TrainOptions other_tasks = warm;
  other_tasks.out_dir = dir + "/other";
  other_tasks.tasks = {"copy"};
  const std::string source_tokenizer = BuildTokenizer({"add", "copy"}, 20).TokenizerJson();
  ASSERT_NE(BuildTokenizer({"copy"}, 20).TokenizerJson(), source_tokenizer);
  EXPECT_EQ(Trainer(other_tasks).tokenizer().TokenizerJson(), source_tokenizer);

  // Other flags cannot silently resume a checkpoint.
  TrainOptions other = resumed;
  other.lr = 1e-4f;
  EXPECT_THROW(Trainer{other}, Error);
}

// A later stage can start from an exported (or bundled) model folder: its parameters come
// back exactly through Export's split of the stacked matrices, with its tokenizer.
TEST(TrainerTest, WarmStartsFromAModelFolder) {
  const std::string dir = testing::TempDir();
  Trainer source(TinyRun(dir + "/source", 5));
  for (int i = 0; i < 3; ++i) source.Step();
  source.ExportModel();
  TrainOptions warm = TinyRun(dir + "/warm", 5);
  warm.init_from = source.ModelDir();
  warm.tasks = {"copy"};  // its own merges would differ; the source's tokenizer is kept
  const Trainer started(warm);
  EXPECT_EQ(started.step(), 0);
  EXPECT_EQ(started.model().params(), source.model().params());
  EXPECT_EQ(started.tokenizer().TokenizerJson(), source.tokenizer().TokenizerJson());
  TrainOptions wider = warm;
  wider.width = 32;
  try {
    Trainer{wider};
    ADD_FAILURE() << "a model of another shape was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.transformer.wte.weight"), std::string::npos)
        << e.what();
  }
}

// A deeper model grows from a shallower one: source block s lands at s * layers / source
// layers, the blocks between add nothing (zero output projections), so the grown model's
// logits are the source's exactly; a shallower target is refused.
TEST(TrainerTest, GrowsInDepthFromAShallowerRun) {
  const std::string dir = testing::TempDir();
  TrainOptions shallow = TinyRun(dir + "/shallow", 5);
  shallow.layers = 2;
  Trainer source(shallow);
  for (int i = 0; i < 3; ++i) source.Step();
  source.SaveCheckpoint();
  source.ExportModel();
  TrainOptions deep = TinyRun(dir + "/deep", 5);
  deep.layers = 4;
  deep.init_from = dir + "/shallow";  // a run folder: its checkpoint is another size
  const Trainer grown(deep);

  const TinyModel& from = source.model();
  const TinyModel& to = grown.model();
  auto tensor = [](const TinyModel& m, const std::string& name) {
    for (const ParamTensor& t : m.tensors()) {
      if (t.name == name) {
        return std::vector<float>(m.params().begin() + t.offset,
                                  m.params().begin() + t.offset + t.size());
      }
    }
    ADD_FAILURE() << "no tensor " << name;
    return std::vector<float>();
  };
  const std::string block = "model.transformer.blocks.";
  for (const std::string part : {".qkv", ".attn_out.weight", ".gate_up", ".ff_out.weight"}) {
    EXPECT_EQ(tensor(to, block + "0" + part), tensor(from, block + "0" + part)) << part;
    EXPECT_EQ(tensor(to, block + "2" + part), tensor(from, block + "1" + part)) << part;
  }
  for (const std::string added : {"1", "3"}) {
    for (float w : tensor(to, block + added + ".attn_out.weight")) ASSERT_EQ(w, 0.0f);
    for (float w : tensor(to, block + added + ".ff_out.weight")) ASSERT_EQ(w, 0.0f);
    const std::vector<float> qkv = tensor(to, block + added + ".qkv");
    EXPECT_GT(std::inner_product(qkv.begin(), qkv.end(), qkv.begin(), 0.0), 0.0);
  }

  Batch batch = SmallBatch();
  for (int& token : batch.tokens) token %= from.config().vocab;
  std::vector<float> expected, ours;
  TinyModel(from).Run(batch, nullptr, &expected);  // copies: Run keeps its activations
  TinyModel(to).Run(batch, nullptr, &ours);
  EXPECT_EQ(ours, expected);

  TrainOptions shallower = TinyRun(dir + "/shallower", 5);
  shallower.init_from = dir + "/shallow";  // 1 block from 2
  EXPECT_THROW(Trainer{shallower}, Error);
}

TEST(TrainerTest, LossFallsOnATinyRun) {
  TrainOptions o = TinyRun(testing::TempDir(), 30);
  o.lr = 1e-2f;
  o.batch = 16;
  Trainer trainer(o);
  double first = 0.0, last = 0.0;
  for (int i = 0; i < 30; ++i) {
    const double loss = trainer.Step();
    if (i < 5) first += loss;
    if (i >= 25) last += loss;
  }
  EXPECT_LT(last, 0.7 * first);
}

namespace fs = std::filesystem;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Every file under `dir` with its bytes: what a refused command must leave as it was.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().string()] = ReadText(entry.path().string());
  }
  return files;
}

constexpr const char* kLossHeader = "step,loss,lr,grad_norm,tokens_per_s,elapsed_s\n";

TEST(TrainerTest, AFreshRunRefusesAFolderThatHoldsARunUnlessForced) {
  const std::string dir = testing::TempDir();
  for (const std::string name :
       {"checkpoint.safetensors", "checkpoint.json", "loss.csv", "eval.csv", "model"}) {
    const std::string run = dir + "/holds-" + name;
    fs::create_directories(run + (name == "model" ? "/model" : ""));
    WriteText(run + "/" + (name == "model" ? "model/config.json" : name), "an earlier run");
    const auto before = Snapshot(run);
    TrainOptions o = TinyRun(run, 2);
    EXPECT_THAT([&] { Trainer(o).Run(); },
                testing::ThrowsErrorContaining({run, name, "--resume", "--force"}));
    EXPECT_EQ(Snapshot(run), before) << name;
  }

  // Forced, the earlier run's checkpoint and logs go; what is not the run's stays.
  const std::string run = dir + "/forced";
  fs::create_directories(run);
  for (const char* name : {"checkpoint.safetensors", "checkpoint.json", "loss.csv", "eval.csv"})
    WriteText(run + "/" + name, "an earlier run");
  WriteText(run + "/notes.txt", "mine");
  TrainOptions o = TinyRun(run, 2);
  o.force = true;
  o.eval_items = 1;
  Trainer(o).Run();
  EXPECT_EQ(ReadText(run + "/notes.txt"), "mine");
  EXPECT_EQ(ReadText(run + "/eval.csv").find("an earlier run"), std::string::npos);
  EXPECT_EQ(ReadText(run + "/loss.csv").find("an earlier run"), std::string::npos);
  o.resume = true;
  EXPECT_EQ(Trainer(o).step(), 2);  // its own checkpoint
}

// A checkpoint of TinyRun(dir, 5)'s model: the parameters, the AdamW moments and the step.
void WriteCheckpoint(const std::string& dir, const std::vector<float>& params,
                     const std::vector<float>& m, const std::vector<float>& v, int64_t step) {
  WriteSafetensors(dir + "/checkpoint.safetensors",
                   {F32Tensor("params", {int64_t(params.size())}, params),
                    F32Tensor("adam_m", {int64_t(m.size())}, m),
                    F32Tensor("adam_v", {int64_t(v.size())}, v), I64Tensor("step", {1}, {step})});
}

// Trains two steps of `o` and saves the checkpoint (and checkpoint.json, the options'
// fingerprint); returns the parameters.
std::vector<float> TwoStepsAndACheckpoint(const TrainOptions& o) {
  Trainer trainer(o);
  trainer.Step();
  trainer.Step();
  trainer.SaveCheckpoint();
  return trainer.model().params();
}

TEST(TrainerTest, AResumedCheckpointIsCheckedBeforeAnythingIsWritten) {
  const std::string dir = testing::TempDir();
  TrainOptions o = TinyRun(dir, 5);
  o.eval_items = 1;
  std::vector<float> params = TwoStepsAndACheckpoint(o);
  WriteText(dir + "/loss.csv", kLossHeader);
  const size_t n = params.size();
  const std::vector<float> m(n, 0.01f), v(n, 1e-4f);
  o.resume = true;
  WriteCheckpoint(dir, params, m, v, 2);
  EXPECT_EQ(Trainer(o).step(), 2);  // the good checkpoint each case breaks in one place

  std::vector<float> nan = params, negative = v, shorter = params;
  nan[7] = std::nanf("");
  negative[3] = -1e-6f;
  shorter.pop_back();
  const std::string path = dir + "/checkpoint.safetensors";
  const std::vector<std::pair<std::function<void()>, std::vector<std::string>>> cases = {
      {[&] { WriteCheckpoint(dir, nan, m, v, 2); }, {"params[7] is nan"}},
      {[&] { WriteCheckpoint(dir, params, m, negative, 2); }, {"adam_v[3] is negative"}},
      {[&] { WriteCheckpoint(dir, shorter, m, v, 2); },
       {"tensor params is F32 of ", Cat(n - 1, " values"), Cat(n, " F32 parameters")}},
      {[&] { WriteCheckpoint(dir, params, m, v, 6); }, {"step 6 is outside the run's 0..5"}},
      {[&] { WriteCheckpoint(dir, params, m, v, -1); }, {"step -1 is outside"}},
      {[&] { WriteCheckpoint(dir, params, m, v, 0); }, {"moments are not zero at step 0"}},
      {[&] {
         WriteSafetensors(
             path, {F32Tensor("params", {int64_t(n)}, params), F32Tensor("adam_v", {int64_t(n)}, v),
                    I64Tensor("step", {1}, {2})});
       },
       {"missing tensor 'adam_m'"}},
  };
  for (const auto& [damage, message] : cases) {
    damage();
    const auto before = Snapshot(dir);
    std::vector<std::string> parts = message;
    parts.push_back(path);
    EXPECT_THAT([&] { Trainer(o).Run(); }, testing::ThrowsErrorContaining(parts));
    EXPECT_EQ(Snapshot(dir), before) << message[0];
  }
}

// A step whose loss is not finite stops the run before its update: the checkpoint written
// at every step (--checkpoint-every 1) stays the last good one.
TEST(TrainerTest, ANonFiniteLossStopsTheRunAndKeepsTheCheckpoint) {
  const std::string dir = testing::TempDir();
  TrainOptions o = TinyRun(dir, 5);
  o.checkpoint_every = 1;
  std::vector<float> params = TwoStepsAndACheckpoint(o);
  // Finite, so the checkpoint is valid, but large enough that the forward overflows.
  for (float& p : params) p *= 1e30f;
  WriteCheckpoint(dir, params, std::vector<float>(params.size(), 0.01f),
                  std::vector<float>(params.size(), 1e-4f), 2);
  const std::string checkpoint = ReadText(dir + "/checkpoint.safetensors");
  o.resume = true;
  EXPECT_THAT([&] { Trainer(o).Run(); },
              testing::ThrowsErrorContaining({"step 3: the loss is", "checkpoint.safetensors"}));
  EXPECT_EQ(ReadText(dir + "/checkpoint.safetensors"), checkpoint);
  EXPECT_EQ(ReadText(dir + "/loss.csv"), kLossHeader);  // no row for the diverged step
}

TEST(TrainerTest, ADamagedLossLogIsAnErrorNamingItsLine) {
  const std::string dir = testing::TempDir();
  TrainOptions o = TinyRun(dir, 3);
  o.eval_items = 1;
  TwoStepsAndACheckpoint(o);
  o.resume = true;
  const std::string path = dir + "/loss.csv";
  const std::string row1 = "1,5.5,0.001,2.5,1000,0.1\n", row2 = "2,5.25,0.002,2.25,1000,0.2\n";
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"step,loss\n" + row1, ":1: not the loss log's header"},
      {kLossHeader + row1 + "x,y\n" + row2, ":3: not a row of"},
      {kLossHeader + row1 + "2,5.25,abc,2.25,1000,0.2\n", ":3: not a row of"},
      {kLossHeader + row1 + row1 + row2, ":3: not a row of"},  // steps must increase
      {kLossHeader + row1 + "2,5.25,0.002\n", ":3: not a row of"},
  };
  for (const auto& [text, message] : damaged) {
    WriteText(path, text);
    const auto before = Snapshot(dir);
    EXPECT_THAT([&] { Trainer(o).Run(); }, testing::ThrowsErrorContaining({path + message}));
    EXPECT_EQ(Snapshot(dir), before) << message;
  }
  // Rows past the checkpoint's step are dropped unread: the last may be cut short by the
  // interruption.
  WriteText(path, kLossHeader + row1 + row2 + "3,5.1");
  Trainer(o).Run();
  const std::string log = ReadText(path);
  ASSERT_TRUE(log.starts_with(kLossHeader + row1 + row2)) << log;
  const std::string row3 = log.substr((kLossHeader + row1 + row2).size());
  EXPECT_TRUE(row3.starts_with("3,")) << log;
  EXPECT_EQ(std::count(row3.begin(), row3.end(), ','), 5) << log;
  EXPECT_TRUE(row3.ends_with("\n")) << log;
}

TEST(TrainerTest, RepeatedTasksWeighTheMixture) {
  TrainOptions o = TinyRun(testing::TempDir(), 5);
  o.tasks = {"add", "add", "add", "copy"};
  o.batch = 400;
  const auto tasks = SelectedTasks(o);
  EXPECT_EQ(DistinctTasks(tasks), std::vector<std::string>({"add", "copy"}));
  const BpeTokenizer tok = BuildTokenizer(tasks, o.bpe_merges);
  const Batch batch = MakeBatch(tok, MakeTinyConfig(o, tok), o, tasks, 0);
  int adds = 0;
  for (size_t s = 0; s + 1 < batch.starts.size(); ++s) {
    const int len = batch.starts[s + 1] - batch.starts[s] - o.gen_length;
    const std::vector<int> prompt(batch.tokens.begin() + batch.starts[s],
                                  batch.tokens.begin() + batch.starts[s] + len);
    if (tok.Decode(prompt).find("Compute") != std::string::npos) ++adds;
  }
  EXPECT_NEAR(adds / 400.0, 0.75, 0.07);
  // The tokenizer does not depend on the mixture.
  EXPECT_EQ(tok.TokenizerJson(), BuildTokenizer({"copy", "add"}, o.bpe_merges).TokenizerJson());
}

TEST(TrainerTest, BatchFollowsTheSftObjective) {
  TrainOptions o = TinyRun(testing::TempDir(), 5);
  o.batch = 8;
  const auto tasks = SelectedTasks(o);
  const BpeTokenizer tok = BuildTokenizer(tasks, o.bpe_merges);
  const TinyConfig config = MakeTinyConfig(o, tok);
  const Batch a = MakeBatch(tok, config, o, tasks, 3), b = MakeBatch(tok, config, o, tasks, 3);
  EXPECT_EQ(a.tokens, b.tokens);  // a pure function of (seed, step)
  EXPECT_EQ(a.targets, b.targets);
  ASSERT_EQ(a.starts.size(), 9u);
  for (size_t s = 0; s + 1 < a.starts.size(); ++s) {
    const int len = a.starts[s + 1] - a.starts[s];
    const int answer_begin = a.starts[s + 1] - o.gen_length;
    EXPECT_GT(len, o.gen_length);
    EXPECT_EQ(a.tokens[size_t(a.starts[s])], tok.TokenId(kBosToken));
    for (int r = a.starts[s]; r < a.starts[s + 1]; ++r) {
      EXPECT_EQ(a.positions[size_t(r)], r - a.starts[s]);
      // The prompt is never masked.
      if (r < answer_begin) {
        EXPECT_NE(a.tokens[size_t(r)], config.mask_id);
      }
    }
  }
  for (size_t i = 0; i < a.target_rows.size(); ++i) {
    EXPECT_EQ(a.tokens[size_t(a.target_rows[i])], config.mask_id);
    EXPECT_GE(a.weights[i], 1.0f / (o.gen_length * o.batch));  // 1/t >= 1
  }
}

TEST(TokenizerTest, RoundTripAndPieces) {
  const BpeTokenizer tok = BuildTokenizer(TaskNames(), 100);
  for (const std::string& task : TaskNames()) {
    const TaskItem item = MakeTaskItem(task, Split::kTest, 0, 9);
    const std::string text = ChatPrompt(item.prompt) + item.answer;
    EXPECT_EQ(tok.Decode(tok.Encode(text)), text);
  }
  // Special tokens are single ids; digits never merge.
  const std::vector<int> ids = tok.Encode("<|startoftext|>Compute 4821 + 937.<|eot_id|>");
  EXPECT_EQ(ids.front(), tok.TokenId(kBosToken));
  EXPECT_EQ(ids.back(), tok.TokenId(kEotToken));
  std::string digits;
  for (int id : ids) {
    const std::string& t = tok.token(id);
    if (std::any_of(t.begin(), t.end(), ::isdigit)) {
      EXPECT_EQ(t.size(), 1u) << t;
      digits += t;
    }
  }
  EXPECT_EQ(digits, "4821937");
  // GPT-2 pre-tokenisation: a space joins the following word; of a whitespace run before a
  // word the last character is left to it.
  const std::vector<int> spaced = tok.Encode("a  b\n\nc");
  EXPECT_EQ(tok.Decode(spaced), "a  b\n\nc");
  EXPECT_EQ(tok.Encode(" b"), std::vector<int>({tok.TokenId("\xC4\xA0"
                                                            "b")}));
  EXPECT_THROW(tok.Encode("caf\xC3\xA9"), Error);
}

// The trainer encodes with the engine's tokenizer: the files it writes load into a Tokenizer
// that gives the training data's ids, on every task's prompts and answers.
TEST(TokenizerTest, TrainingIdsAreTheEnginesIds) {
  const BpeTokenizer tok = BuildTokenizer(TaskNames(), 300);
  const std::string dir = testing::TempDir();
  tok.WriteFiles(dir, 256);
  const std::unique_ptr<Tokenizer> engine = Tokenizer::Load(dir);
  for (const std::string& task : TaskNames()) {
    for (uint64_t i = 0; i < 20; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTrain, i, 3);
      for (const std::string& text : {ChatPrompt(item.prompt), item.answer}) {
        ASSERT_EQ(tok.Encode(text), engine->Encode(text)) << text;
        EXPECT_EQ(tok.Decode(tok.Encode(text)), text);
      }
    }
  }
}

TEST(TokenizerTest, WritesHuggingFaceFiles) {
  const BpeTokenizer tok = BuildTokenizer(TaskNames(), 50);
  const std::string dir = testing::TempDir();
  tok.WriteFiles(dir, 256);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/tokenizer.json"));
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["vocab"].size(), size_t(tok.vocab_size()));
  EXPECT_EQ(j["model"]["merges"].size(), size_t(tok.merge_count()));
  EXPECT_EQ(j["model"]["vocab"]["<|mdm_mask|>"], tok.TokenId(kMaskToken));
  EXPECT_EQ(j["added_tokens"].size(), 6u);
  // Every merge's parts and result are in the vocabulary (what HF checks at load).
  for (const auto& merge : j["model"]["merges"]) {
    const std::string m = merge;
    const size_t space = m.find(' ');
    ASSERT_NE(space, std::string::npos);
    EXPECT_TRUE(j["model"]["vocab"].contains(m.substr(0, space)));
    EXPECT_TRUE(j["model"]["vocab"].contains(m.substr(space + 1)));
    EXPECT_TRUE(j["model"]["vocab"].contains(m.substr(0, space) + m.substr(space + 1)));
  }
  const nlohmann::json config =
      nlohmann::json::parse(std::ifstream(dir + "/tokenizer_config.json"));
  EXPECT_EQ(config["bos_token"], "<|startoftext|>");
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  EXPECT_EQ(config["clean_up_tokenization_spaces"], false);
}

TEST(TrainCliTest, TrainsExportsAndEvaluates) {
  const std::string dir = testing::TempDir();
  std::string out;
  ASSERT_EQ(testing::RunCli("train --out " + dir +
                                " --steps 3 --layers 1 --width 16 --heads 2 "
                                "--ffn 16 --merges 20 --tasks add --batch 2 --gen-length 64 "
                                "--eval-items 1 --checkpoint-every 2 --log-every 1 -t 1",
                            &out, true),
            0)
      << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;
  EXPECT_NE(out.find("tok/s"), std::string::npos);
  EXPECT_NE(out.find("eval step 3: add"), std::string::npos) << out;
  for (const char* file :
       {"model/config.json", "model/model.safetensors", "model/tokenizer.json",
        "model/tokenizer_config.json", "checkpoint.safetensors", "loss.csv", "eval.csv"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + file)) << file;
  }
  std::ifstream csv(dir + "/loss.csv");
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 4);  // header + 3 steps
  const std::string loss_log = ReadText(dir + "/loss.csv");

  // The same command again would overwrite the run: refused, with a message and status 1.
  const std::string again = "train --out " + dir +
                            " --steps 1 --layers 1 --width 16 --heads 2 --ffn 16 --merges 20 "
                            "--tasks add --batch 2 --gen-length 64 --eval-items 1 -t 1";
  EXPECT_EQ(testing::RunCli(again, &out, true), 1) << out;
  EXPECT_NE(out.find("already holds a run"), std::string::npos) << out;
  EXPECT_EQ(ReadText(dir + "/loss.csv"), loss_log);
  ASSERT_EQ(testing::RunCli(again + " --force", &out, true), 0) << out;
  ASSERT_EQ(testing::RunCli(again + " --resume", &out, true), 0) << out;  // a finished run

  ASSERT_EQ(testing::RunCli("tasks-eval -m " + dir +
                                "/model --tasks add --items 2 "
                                "--gen-length 64 --block-length 16 --steps 64 -t 1 --json",
                            &out),
            0)
      << out;
  const nlohmann::json result = nlohmann::json::parse(out);
  EXPECT_EQ(result["tasks"][0]["task"], "add");
  EXPECT_EQ(result["tasks"][0]["total"], 2);
  EXPECT_EQ(result["nfe"], 64.0);

  // The tokenizer written with the model reads back to the same encoder.
  const BpeTokenizer loaded = BpeTokenizer::Load(dir + "/model");
  const BpeTokenizer built = BuildTokenizer({"add"}, 20);
  const std::string text = ChatPrompt("Compute 12 + 30.");
  EXPECT_EQ(loaded.Encode(text), built.Encode(text));
  EXPECT_THROW(BpeTokenizer::Load(dir), Error);  // no tokenizer.json there
}

}  // namespace
}  // namespace polestar::train
