// Per-layer storage of one canvas: keys (RoPE applied), values and, optionally, the
// layer-input hidden state of every position. It stores rows; it never decides which rows
// are fresh — policies do, through step plans.
#pragma once

#include <cstdint>
#include <vector>

namespace polestar {

class KvCache {
 public:
  KvCache() = default;
  // `keep_hidden` also stores each layer's input hidden state per position, so rows can be
  // recomputed from any layer later (Elastic-Cache, Polestar).
  KvCache(int layers, int64_t positions, int64_t kv_width, int64_t hidden_width, bool keep_hidden);

  int layers() const { return layers_; }
  int64_t positions() const { return positions_; }
  int64_t kv_width() const { return kv_width_; }
  int64_t hidden_width() const { return hidden_width_; }
  bool keeps_hidden() const { return keep_hidden_; }

  float* keys(int layer) { return keys_[layer].data(); }      // [L, Hkv*D], rotated
  float* values(int layer) { return values_[layer].data(); }  // [L, Hkv*D]
  float* hidden(int layer) { return hidden_[layer].data(); }  // [L, C] layer input
  const float* keys(int layer) const { return keys_[layer].data(); }
  const float* values(int layer) const { return values_[layer].data(); }
  const float* hidden(int layer) const { return hidden_[layer].data(); }

  int64_t Bytes() const;

 private:
  int layers_ = 0;
  int64_t positions_ = 0, kv_width_ = 0, hidden_width_ = 0;
  bool keep_hidden_ = false;
  std::vector<std::vector<float>> keys_, values_, hidden_;
};

}  // namespace polestar
