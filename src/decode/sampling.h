// Pure functions of one decoding step: turning a logits row into a token and a confidence,
// how many tokens a step commits (schedules), and which candidates a rule selects.
// Each mirrors a reference function (named in its comment) and is unit-tested by hand.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/types.h"

namespace polestar {

using Rng = std::mt19937_64;

struct TokenChoice {
  int token = 0;
  double confidence = 0;
};

// LLaDA / Fast-dLLM get_transfer_index: argmax of the logits, or at temperature > 0 of
// exp(logits) / (-log u)^T in float64 (Gumbel-max sampling); confidence is the float64
// softmax probability of the chosen token, or U(0, 1) with random remasking.
// `excluded` (the mask token) is never chosen: committing it would leave the position masked
// while counting it as decoded. The confidence is still over the whole vocabulary, so every
// step where the mask is not the model's first choice is exactly the reference's.
TokenChoice ChooseLlada(std::span<const float> logits, int excluded, double temperature,
                        bool random_remasking, Rng& rng);

enum class DreamConfidence { kProbability, kMargin, kNegEntropy };

// Dream sample_tokens: logits / T, top-p, top-k, softmax (fp32); sample at T > 0, else
// argmax; confidence = chosen probability, top1 - top2 margin, or sum p log(p + 1e-10).
// `excluded` is never chosen, as in ChooseLlada: a sample that lands on it takes the most
// probable other token.
TokenChoice ChooseDream(std::span<const float> logits, int excluded, double temperature,
                        double top_p, int top_k, DreamConfidence kind, Rng& rng);

// Whether ChooseDream filters the logits (top-p, top-k) before its softmax.
bool DreamFilters(double top_p, int top_k);

// At temperature 0 each sampler's choice is the greedy choice of its row (ops/ops.h
// GreedyChoiceOf) by these specs, ChooseDream's when it does not filter; a backend computes it
// from the logits where they are (Backend::GreedyChoices), bit for bit the sampler's.
GreedySpec LladaGreedySpec(int excluded, bool random_remasking);
GreedySpec DreamGreedySpec(int excluded, DreamConfidence kind);
// The sampler's choice from the greedy choice of its row by `spec`: random remasking (kNone)
// draws its confidence here, from the host's stream, as ChooseLlada does.
TokenChoice FromGreedy(const GreedyChoice& greedy, const GreedySpec& spec, Rng& rng);

// LLaDA get_num_transfer_tokens: `masks` split over `steps`, remainder to the first steps.
std::vector<int> NumTransferTokens(int masks, int steps);

// torch.linspace(1, eps, steps + 1) in float32, as torch's CPU kernel computes it.
std::vector<float> DreamTimesteps(int steps, float eps);

// Dream's count for step i: int(masks * (1 - s / t)) in float32, all remaining at the last step.
int DreamTransferCount(int masks, int step, int steps, const std::vector<float>& timesteps);

// Selection rules over candidate confidences; each returns candidate indices, most
// confident first (ties: lower index first, i.e. leftmost position).
std::vector<size_t> SelectTopK(std::span<const double> confidence, size_t k);
// Fast-dLLM threshold: the most confident always, plus every other with conf >= threshold.
std::vector<size_t> SelectThreshold(std::span<const double> confidence, double threshold);
// Fast-dLLM factor (get_transfer_index_dynamic): accept the n-th most confident while
// conf_n >= 1 - factor / (n + 1); the first always. Reproduces the reference's quirk of
// also accepting the last candidate when only the last one fails.
std::vector<size_t> SelectFactor(std::span<const double> confidence, double factor);

// Samples k distinct indices with probabilities softmax(confidence / temperature), as
// torch.multinomial without replacement (Dream's alg_temp).
std::vector<size_t> SampleWithoutReplacement(std::span<const double> confidence, double temperature,
                                             size_t k, Rng& rng);

}  // namespace polestar
