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
  require(heads % kv_heads == 0, "key/value head count (", kv_heads,
          ") must divide the head count (", heads, ")");
  require(head_dim > 0 && head_dim % 2 == 0, "head dimension (", head_dim,
          ") must be positive and even (RoPE)");
  bool any_dense = moe.experts == 0;
  for (int l = 0; l < layers && !any_dense; ++l) any_dense = !IsMoeLayer(l);
  require(!any_dense || ffn > 0, "feed-forward width (", ffn, ") must be positive");
  require(clip_qkv >= 0, "clip_qkv (", clip_qkv, ") must not be negative");
  require(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rotary dimension (",
          rotary_dim, ") must be positive, even and at most the head dimension (", head_dim, ")");
  if (moe.experts != 0) {
    require(moe.experts > 0, "expert count (", moe.experts, ") must be positive");
    require(moe.experts_per_token > 0 && moe.experts_per_token <= moe.experts,
            "experts per token (", moe.experts_per_token, ") must lie in [1, ", moe.experts, "]");
    require(moe.expert_ffn > 0, "expert feed-forward width (", moe.expert_ffn,
            ") must be positive");
    require(moe.shared_ffn >= 0, "shared expert width (", moe.shared_ffn, ") must not be negative");
    require(int64_t(moe.moe_layers.size()) == layers, "the MoE layer list has ",
            moe.moe_layers.size(), " entries for ", layers, " layers");
    require(moe.groups >= 1 && moe.experts % moe.groups == 0 &&
                (moe.groups == 1 || moe.experts / moe.groups >= 2),
            "expert groups (", moe.groups, ") must divide the ", moe.experts,
            " experts into groups of at least two");
    require(moe.top_groups >= 1 && moe.top_groups <= moe.groups, "kept expert groups (",
            moe.top_groups, ") must lie in [1, ", moe.groups, "]");
    require(moe.routed_scaling > 0, "routed scaling factor (", moe.routed_scaling,
            ") must be positive");
  }
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
