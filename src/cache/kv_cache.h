// Per-layer storage of one canvas: keys (RoPE applied), values and, optionally, the
// layer-input hidden state of every position, in the memory of the backend that computes
// them. It stores rows; it never decides which rows are fresh — policies do, through step
// plans. Policies never read it directly: they ask the model's drift ops (model/forward.h)
// for what they need of it. A batch of sequences keeps one KvCache per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace polestar {

class KvCache {
 public:
  KvCache() = default;
  // `keep_hidden` also stores each layer's input hidden state per position, so rows can be
  // recomputed from any layer later (Elastic-Cache, Polestar).
  KvCache(const Backend& backend, int layers, int64_t positions, int64_t kv_width,
          int64_t hidden_width, bool keep_hidden);

  const Backend& backend() const { return *backend_; }
  int layers() const { return layers_; }
  int64_t positions() const { return positions_; }
  int64_t kv_width() const { return kv_width_; }
  int64_t hidden_width() const { return hidden_width_; }
  bool keeps_hidden() const { return keep_hidden_; }

  // Backend memory, for the backend's ops (Forward, the drift ops) and tests on the CPU.
  float* keys(int layer) { return keys_[layer].data(); }      // [L, Hkv*D], rotated
  float* values(int layer) { return values_[layer].data(); }  // [L, Hkv*D]
  float* hidden(int layer) { return hidden_[layer].data(); }  // [L, C] layer input
  const float* keys(int layer) const { return keys_[layer].data(); }
  const float* values(int layer) const { return values_[layer].data(); }
  const float* hidden(int layer) const { return hidden_[layer].data(); }

  int64_t Bytes() const;

 private:
  const Backend* backend_ = nullptr;
  int layers_ = 0;
  int64_t positions_ = 0, kv_width_ = 0, hidden_width_ = 0;
  bool keep_hidden_ = false;
  std::vector<Buffer> keys_, values_, hidden_;  // [layers] each
};

}  // namespace polestar
