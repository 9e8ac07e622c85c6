#include "cache/kv_cache.h"

#include <cstddef>

namespace polestar {

KvCache::KvCache(int layers, int64_t positions, int64_t kv_width, int64_t hidden_width,
                 bool keep_hidden)
    : layers_(layers),
      positions_(positions),
      kv_width_(kv_width),
      hidden_width_(hidden_width),
      keep_hidden_(keep_hidden),
      keys_(layers, std::vector<float>(size_t(positions * kv_width))),
      values_(layers, std::vector<float>(size_t(positions * kv_width))),
      hidden_(keep_hidden ? layers : 0, std::vector<float>(size_t(positions * hidden_width))) {}

int64_t KvCache::Bytes() const {
  return int64_t(layers_) * positions_ * (2 * kv_width_ + (keep_hidden_ ? hidden_width_ : 0)) * 4;
}

}  // namespace polestar
