// Pieces of the Elastic-Cache policy (policy_elastic_cache.cpp) that tests check on their own.
#pragma once

#include <span>

namespace polestar {

// cos(a, b) in double. Two zero vectors count as identical (1); one zero vector as
// unrelated (0). Sizes must match.
double CosineSimilarity(std::span<const double> a, std::span<const double> b);

}  // namespace polestar
