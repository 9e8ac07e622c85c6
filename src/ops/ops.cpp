#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "ops/avx2/avx2.h"
#include "ops/isa.h"
#include "ops/quant.h"
#include "ops/reference.h"

namespace polestar {

void DequantizeRow(const WeightView& w, int64_t n, float* out) {
  if (IsaSupported(Isa::kAvx2)) {
    avx2::DequantizeRow(w, n, out);
  } else {
    reference::DequantizeRow(w, n, out);
  }
}

void DimensionMajorDots(const double* x_by_dim, int64_t n, int64_t d, const double* u,
                        double* out) {
  static const bool avx2 = IsaSupported(Isa::kAvx2);
  (avx2 ? avx2::DimensionMajorDots : reference::DimensionMajorDots)(x_by_dim, n, d, u, out);
}

namespace {

void Rotate(float* x, std::span<const int> positions, int heads, const RopeTable& table,
            bool interleaved, float direction) {
  const int head_dim = table.head_dim;
  const int half = table.rotary_dim / 2;
  for (size_t i = 0; i < positions.size(); ++i) {
    PS_CHECK(size_t(positions[i]) * half < table.cos.size());
    const float* cos_row = &table.cos[size_t(positions[i]) * half];
    const float* sin_row = &table.sin[size_t(positions[i]) * half];
    for (int h = 0; h < heads; ++h) {
      float* xh = x + (int64_t(i) * heads + h) * head_dim;
      for (int f = 0; f < half; ++f) {
        const float cos_a = cos_row[f];
        const float sin_a = direction * sin_row[f];
        float* a = interleaved ? &xh[2 * f] : &xh[f];
        float* b = interleaved ? &xh[2 * f + 1] : &xh[f + half];
        const float x0 = *a, x1 = *b;
        *a = x0 * cos_a - x1 * sin_a;
        *b = x1 * cos_a + x0 * sin_a;
      }
    }
  }
}

}  // namespace

void ApplyRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
               bool interleaved) {
  Rotate(x, positions, heads, table, interleaved, 1.0f);
}

void UndoRope(float* x, std::span<const int> positions, int heads, const RopeTable& table,
              bool interleaved) {
  Rotate(x, positions, heads, table, interleaved, -1.0f);
}

void RouteTopK(const float* logits, int64_t m, const RouterSpec& spec, int* chosen,
               float* weights) {
  const int experts = spec.experts, k = spec.top_k;
  PS_CHECK(experts > 0 && k > 0 && k <= experts);
  PS_CHECK(spec.groups >= 1 && experts % spec.groups == 0 && spec.top_groups >= 1 &&
           spec.top_groups <= spec.groups);
  const int group_size = experts / spec.groups;
  PS_CHECK(spec.groups == 1 || group_size >= 2);
  std::vector<float> scores(static_cast<size_t>(experts));     // [E] s
  std::vector<float> selection(static_cast<size_t>(experts));  // [E] v = s + bias
  std::vector<int> order(static_cast<size_t>(experts));        // [E] expert indices, best first
  std::vector<float> group_scores(static_cast<size_t>(spec.groups));  // [groups]
  std::vector<int> group_order(static_cast<size_t>(spec.groups));
  // Larger first, ties to the lower index (torch.topk's order on CPU).
  auto by_value = [](const std::vector<float>& values) {
    return [&values](int a, int b) {
      return values[size_t(a)] > values[size_t(b)] ||
             (values[size_t(a)] == values[size_t(b)] && a < b);
    };
  };
  for (int64_t r = 0; r < m; ++r) {
    const float* row = logits + r * experts;
    if (spec.score == RouterScore::kSoftmax) {
      // As torch computes it in fp32: exp(x - max) / sum.
      float max = row[0];
      for (int e = 1; e < experts; ++e) max = std::max(max, row[e]);
      float sum = 0.0f;
      for (int e = 0; e < experts; ++e) {
        scores[size_t(e)] = std::exp(row[e] - max);
        sum += scores[size_t(e)];
      }
      for (int e = 0; e < experts; ++e) scores[size_t(e)] /= sum;
    } else {
      for (int e = 0; e < experts; ++e) scores[size_t(e)] = 1.0f / (1.0f + std::exp(-row[e]));
    }
    for (int e = 0; e < experts; ++e)
      selection[size_t(e)] = scores[size_t(e)] + (spec.bias != nullptr ? spec.bias[e] : 0.0f);
    if (spec.groups > 1) {
      for (int g = 0; g < spec.groups; ++g) {
        const float* v = &selection[size_t(g * group_size)];
        float first = -INFINITY, second = -INFINITY;
        for (int i = 0; i < group_size; ++i) {
          if (v[i] > first) {
            second = first;
            first = v[i];
          } else if (v[i] > second) {
            second = v[i];
          }
        }
        group_scores[size_t(g)] = first + second;
        group_order[size_t(g)] = g;
      }
      std::partial_sort(group_order.begin(), group_order.begin() + spec.top_groups,
                        group_order.end(), by_value(group_scores));
      for (int i = spec.top_groups; i < spec.groups; ++i) {
        const int g = group_order[size_t(i)];
        std::fill_n(selection.begin() + g * group_size, group_size, -INFINITY);
      }
    }
    for (int e = 0; e < experts; ++e) order[size_t(e)] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), by_value(selection));
    const std::vector<float>& weight_of = spec.bias_in_weights ? selection : scores;
    float total = 0.0f;
    for (int i = 0; i < k; ++i) total += weight_of[size_t(order[size_t(i)])];
    for (int i = 0; i < k; ++i) {
      const int e = order[size_t(i)];
      chosen[r * k + i] = e;
      const float weight =
          spec.normalize ? weight_of[size_t(e)] / (total + 1e-20f) : weight_of[size_t(e)];
      weights[r * k + i] = weight * spec.scaling;
    }
  }
}

void Clamp(float* x, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::clamp(x[i], -limit, limit);
}

void CombineExperts(const float* src, const float* scales, const int* slots, int64_t m, int k,
                    int64_t width, float* dst) {
  for (int64_t r = 0; r < m; ++r) {
    float* to = dst + r * width;
    for (int i = 0; i < k; ++i) {
      const int64_t slot = slots[r * k + i];
      const float scale = scales[slot];
      const float* from = src + slot * width;
      for (int64_t j = 0; j < width; ++j) to[j] += scale * from[j];
    }
  }
}

size_t ArgMaxExcept(std::span<const float> x, int excluded) {
  size_t best = x.size();  // the first index wins ties, as torch.argmax
  for (size_t i = 0; i < x.size(); ++i) {
    if (int64_t(i) != excluded && (best == x.size() || x[i] > x[best])) best = i;
  }
  PS_CHECK(best < x.size());
  return best;
}

double Float64SoftmaxProbability(std::span<const float> logits, size_t index) {
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, double(l));
  double total = 0;
  for (float l : logits) total += std::exp(double(l) - max_logit);
  return std::exp(double(logits[index]) - max_logit) / total;
}

void Fp32Softmax(std::span<const float> logits, std::span<float> probs) {
  PS_CHECK(probs.size() == logits.size() && !logits.empty());
  const float max_logit = logits[ArgMaxExcept(logits, -1)];
  float total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp(logits[i] - max_logit);
    total += probs[i];
  }
  for (float& p : probs) p /= total;
}

double Fp32Confidence(std::span<const float> probs, size_t token, GreedyConfidence kind) {
  switch (kind) {
    case GreedyConfidence::kFp32Probability:
      return probs[token];
    case GreedyConfidence::kFp32Margin: {
      float first = -1, second = -1;
      for (float p : probs) {
        if (p > first) {
          second = first;
          first = p;
        } else if (p > second) {
          second = p;
        }
      }
      return double(first - second);
    }
    case GreedyConfidence::kFp32NegEntropy: {
      float sum = 0;
      for (float p : probs) sum += p * std::log(p + 1e-10f);
      return sum;
    }
    case GreedyConfidence::kNone:
    case GreedyConfidence::kFloat64Softmax:
      break;
  }
  PS_CHECK(false);
  return 0;
}

GreedyChoice GreedyChoiceOf(std::span<const float> logits, const GreedySpec& spec,
                            std::span<float> probs) {
  GreedyChoice choice;
  for (float l : logits) {
    if (!std::isfinite(l)) {
      choice.non_finite = l;
      return choice;
    }
  }
  switch (spec.confidence) {
    case GreedyConfidence::kNone:
    case GreedyConfidence::kFloat64Softmax: {
      const size_t token = ArgMaxExcept(logits, spec.excluded);
      choice.token = int32_t(token);
      if (spec.confidence == GreedyConfidence::kFloat64Softmax)
        choice.confidence = Float64SoftmaxProbability(logits, token);
      return choice;
    }
    case GreedyConfidence::kFp32Probability:
    case GreedyConfidence::kFp32Margin:
    case GreedyConfidence::kFp32NegEntropy: {
      Fp32Softmax(logits, probs);
      const size_t token = ArgMaxExcept(probs, spec.excluded);  // of the probabilities, as Dream
      choice.token = int32_t(token);
      choice.confidence = Fp32Confidence(probs, token, spec.confidence);
      return choice;
    }
  }
  PS_CHECK(false);
  return choice;
}

}  // namespace polestar
