#include "cache/kv_cache.h"

namespace polestar {

KvCache::KvCache(const Backend& backend, int layers, int64_t positions, int64_t kv_width,
                 int64_t hidden_width, bool keep_hidden)
    : backend_(&backend),
      layers_(layers),
      positions_(positions),
      kv_width_(kv_width),
      hidden_width_(hidden_width),
      keep_hidden_(keep_hidden),
      keys_(layers, Buffer(backend, positions * kv_width)),
      values_(layers, Buffer(backend, positions * kv_width)),
      hidden_(keep_hidden ? layers : 0,
              Buffer(backend, keep_hidden ? positions * hidden_width : 0)) {}

int64_t KvCache::Bytes() const {
  return int64_t(layers_) * positions_ * (2 * kv_width_ + (keep_hidden_ ? hidden_width_ : 0)) * 4;
}

}  // namespace polestar
