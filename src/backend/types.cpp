#include "backend/types.h"

#include <cmath>

#include "base/error.h"

namespace polestar {

RopeTable::RopeTable(int head_dim_, int rotary_dim_, int max_positions, float theta)
    : head_dim(head_dim_), rotary_dim(rotary_dim_) {
  PS_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim);
  const int half = rotary_dim / 2;
  const size_t count = size_t(max_positions) * half;
  auto angles = std::make_shared<std::vector<float>>(2 * count);  // cos then sin
  float* cos_out = angles->data();
  float* sin_out = angles->data() + count;
  for (int f = 0; f < half; ++f) {
    const float inv_freq = 1.0f / std::pow(theta, float(2 * f) / float(rotary_dim));
    for (int p = 0; p < max_positions; ++p) {
      const float angle = float(p) * inv_freq;
      cos_out[size_t(p) * half + f] = std::cos(angle);
      sin_out[size_t(p) * half + f] = std::sin(angle);
    }
  }
  cos = {cos_out, count};
  sin = {sin_out, count};
  storage_ = std::move(angles);
}

RopeTable RopeTable::WithAngles(std::span<const float> cos_, std::span<const float> sin_) const {
  PS_CHECK(cos_.size() == cos.size() && sin_.size() == sin.size());
  RopeTable table;
  table.head_dim = head_dim;
  table.rotary_dim = rotary_dim;
  table.cos = cos_;
  table.sin = sin_;
  return table;
}

}  // namespace polestar
