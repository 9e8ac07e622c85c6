#include "decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "ops/ops.h"

namespace polestar {
namespace {

double Uniform(Rng& rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }

}  // namespace

TokenChoice ChooseLlada(std::span<const float> logits, int excluded, double temperature,
                        bool random_remasking, Rng& rng) {
  if (temperature <= 0) {
    const GreedySpec spec = LladaGreedySpec(excluded, random_remasking);
    return FromGreedy(GreedyChoiceOf(logits, spec, {}), spec, rng);
  }
  TokenChoice choice;
  // argmax exp(l) / (-log u)^T == argmax l - T log(-log u): compare in log space, in float64.
  double best = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) {
    double u = Uniform(rng);
    u = std::max(u, 1e-300);
    const double score = double(logits[i]) - temperature * std::log(-std::log(u));
    if (score > best && int(i) != excluded) {  // the draw is made anyway: the stream stays aligned
      best = score;
      choice.token = int(i);
    }
  }
  choice.confidence =
      random_remasking ? Uniform(rng) : Float64SoftmaxProbability(logits, size_t(choice.token));
  return choice;
}

TokenChoice ChooseDream(std::span<const float> logits_in, int excluded, double temperature,
                        double top_p, int top_k, DreamConfidence kind, Rng& rng) {
  const size_t n = logits_in.size();
  std::vector<float> logits(logits_in.begin(), logits_in.end());  // [V]
  if (temperature > 0) {
    for (float& l : logits) l = float(l / temperature);
  }
  const float kRemoved = -3.4028234663852886e38f;  // torch.finfo(float32).min
  if (top_p > 0 && top_p < 1) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    std::vector<float> sorted(n);
    for (size_t i = 0; i < n; ++i) sorted[i] = logits[order[i]];
    const float max_logit = sorted[0];
    float total = 0;
    for (float l : sorted) total += std::exp(l - max_logit);
    float cumulative = 0;
    std::vector<bool> remove(n, false);
    for (size_t i = 0; i < n; ++i) {
      cumulative += std::exp(sorted[i] - max_logit) / total;
      // Shifted right by one so the token that crosses top_p is kept.
      if (i + 1 < n) remove[i + 1] = cumulative > top_p;
    }
    for (size_t i = 1; i < n; ++i) {
      if (remove[i]) logits[order[i]] = kRemoved;
    }
  }
  if (top_k > 0) {
    std::vector<float> copy = logits;
    const size_t k = std::min<size_t>(size_t(top_k), n);
    std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<float>());
    const float kth = copy[k - 1];
    for (float& l : logits) {
      if (l < kth) l = kRemoved;
    }
  }
  std::vector<float> probs(n);  // [V] fp32 softmax, as torch.softmax on float32 logits
  const GreedySpec spec = DreamGreedySpec(excluded, kind);
  if (temperature <= 0) return FromGreedy(GreedyChoiceOf(logits, spec, probs), spec, rng);
  Fp32Softmax(logits, probs);
  TokenChoice choice;
  double u = Uniform(rng), cumulative = 0;
  choice.token = int(n - 1);
  for (size_t i = 0; i < n; ++i) {
    cumulative += probs[i];
    if (u < cumulative) {
      choice.token = int(i);
      break;
    }
  }
  if (choice.token == excluded) choice.token = int(ArgMaxExcept(probs, excluded));
  choice.confidence = Fp32Confidence(probs, size_t(choice.token), spec.confidence);
  return choice;
}

bool DreamFilters(double top_p, int top_k) { return (top_p > 0 && top_p < 1) || top_k > 0; }

GreedySpec LladaGreedySpec(int excluded, bool random_remasking) {
  return {random_remasking ? GreedyConfidence::kNone : GreedyConfidence::kFloat64Softmax, excluded};
}

GreedySpec DreamGreedySpec(int excluded, DreamConfidence kind) {
  switch (kind) {
    case DreamConfidence::kProbability:
      return {GreedyConfidence::kFp32Probability, excluded};
    case DreamConfidence::kMargin:
      return {GreedyConfidence::kFp32Margin, excluded};
    case DreamConfidence::kNegEntropy:
      return {GreedyConfidence::kFp32NegEntropy, excluded};
  }
  PS_CHECK(false);
  return {};
}

TokenChoice FromGreedy(const GreedyChoice& greedy, const GreedySpec& spec, Rng& rng) {
  PS_CHECK(greedy.non_finite == 0);
  return {greedy.token,
          spec.confidence == GreedyConfidence::kNone ? Uniform(rng) : greedy.confidence};
}

std::vector<int> NumTransferTokens(int masks, int steps) {
  PS_CHECK(steps > 0);
  std::vector<int> counts(static_cast<size_t>(steps), masks / steps);
  for (int i = 0; i < masks % steps; ++i) counts[size_t(i)] += 1;
  return counts;
}

std::vector<float> DreamTimesteps(int steps, float eps) {
  const int64_t points = steps + 1;
  const float start = 1.0f, end = eps;
  const float step = (end - start) / float(points - 1);
  const int64_t halfway = points / 2;
  std::vector<float> values(static_cast<size_t>(points));
  for (int64_t i = 0; i < points; ++i) {
    values[size_t(i)] = i < halfway ? start + step * float(i) : end - step * float(points - i - 1);
  }
  return values;
}

int DreamTransferCount(int masks, int step, int steps, const std::vector<float>& timesteps) {
  if (step >= steps - 1) return masks;
  const float t = timesteps[size_t(step)];
  const float s = timesteps[size_t(step) + 1];
  const float fraction = 1.0f - s / t;
  return int(float(masks) * fraction);
}

std::vector<size_t> SelectTopK(std::span<const double> confidence, size_t k) {
  std::vector<size_t> order(confidence.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return confidence[a] > confidence[b]; });
  order.resize(std::min(k, order.size()));
  return order;
}

std::vector<size_t> SelectThreshold(std::span<const double> confidence, double threshold) {
  std::vector<size_t> order = SelectTopK(confidence, confidence.size());
  std::vector<size_t> chosen;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || confidence[order[i]] >= threshold) chosen.push_back(order[i]);
  }
  return chosen;
}

std::vector<size_t> SelectFactor(std::span<const double> confidence, double factor) {
  std::vector<size_t> order = SelectTopK(confidence, confidence.size());
  if (order.empty()) return order;
  size_t accepted = 0;
  for (; accepted < order.size(); ++accepted) {
    const double bar = accepted == 0 ? -1.0 : 1.0 - factor / double(accepted + 2);
    if (confidence[order[accepted]] < bar) break;
  }
  if (accepted == order.size() - 1) accepted = order.size();  // the reference's quirk
  order.resize(accepted);
  return order;
}

std::vector<size_t> SampleWithoutReplacement(std::span<const double> confidence, double temperature,
                                             size_t k, Rng& rng) {
  std::vector<double> weight(confidence.size());
  double max_value = -INFINITY;
  for (double c : confidence) max_value = std::max(max_value, c / temperature);
  for (size_t i = 0; i < weight.size(); ++i) {
    weight[i] =
        std::isfinite(confidence[i]) ? std::exp(confidence[i] / temperature - max_value) : 0.0;
  }
  std::vector<size_t> chosen;
  for (size_t draw = 0; draw < k; ++draw) {
    double total = 0;
    for (double w : weight) total += w;
    if (total <= 0) break;
    double u = Uniform(rng) * total;
    size_t pick = weight.size() - 1;
    for (size_t i = 0; i < weight.size(); ++i) {
      if (weight[i] <= 0) continue;
      if (u < weight[i]) {
        pick = i;
        break;
      }
      u -= weight[i];
    }
    chosen.push_back(pick);
    weight[pick] = 0;
  }
  return chosen;
}

}  // namespace polestar
