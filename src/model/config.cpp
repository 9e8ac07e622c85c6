#include "model/config.h"

#include "base/error.h"
#include "model/architecture.h"

namespace polestar {

const char* ArchName(const Architecture* arch) { return arch ? arch->name.c_str() : "unknown"; }

void ModelConfig::Validate(const std::string& where) const {
  auto require = [&](bool ok, const auto&... what) {
    if (!ok) Fail(where, ": ", what...);
  };
  require(vocab > 0, "vocabulary size (", vocab, ") must be positive");
  require(width > 0, "hidden width (", width, ") must be positive");
  require(layers > 0, "layer count (", layers, ") must be positive");
  require(heads > 0, "head count (", heads, ") must be positive");
  require(kv_heads > 0, "key/value head count (", kv_heads, ") must be positive");
  require(width % heads == 0, "head count (", heads, ") must divide the hidden width (", width,
          ")");
  require(heads % kv_heads == 0, "key/value head count (", kv_heads,
          ") must divide the head count (", heads, ")");
  require(head_dim > 0 && head_dim % 2 == 0, "head dimension (", head_dim,
          ") must be positive and even (RoPE)");
  require(ffn > 0, "feed-forward width (", ffn, ") must be positive");
  require(rms_eps > 0, "rms_norm_eps (", rms_eps, ") must be positive");
  require(rope_theta > 0, "rope_theta (", rope_theta, ") must be positive");
  // The RoPE table holds max_positions x D floats; beyond this a typo, not a model.
  require(max_positions > 0 && max_positions <= kMaxPositions, "maximum sequence length (",
          max_positions, ") must lie in [1, ", kMaxPositions, "]");
  require(mask_id >= 0 && mask_id < vocab, "mask token id (", mask_id,
          ") must lie inside the vocabulary (", vocab, ")");
  require(eos_id < vocab && pad_id < vocab && bos_id < vocab && eot_id < vocab,
          "special token ids (eos ", eos_id, ", pad ", pad_id, ", bos ", bos_id, ", eot ", eot_id,
          ") must lie inside the vocabulary (", vocab, ")");
}

}  // namespace polestar
