#include "model/config.h"

#include "base/error.h"

namespace polestar {

const char* ArchName(Arch arch) { return arch == Arch::kLlada ? "llada" : "dream"; }

void ModelConfig::Validate(const std::string& where) const {
  auto require = [&](bool ok, const char* what) {
    if (!ok) Fail(where, ": ", what);
  };
  require(vocab > 0, "vocabulary size must be positive");
  require(width > 0, "hidden width must be positive");
  require(layers > 0, "layer count must be positive");
  require(heads > 0, "head count must be positive");
  require(kv_heads > 0, "key/value head count must be positive");
  require(width % heads == 0, "head count must divide the hidden width");
  require(heads % kv_heads == 0, "key/value head count must divide the head count");
  require(head_dim > 0 && head_dim % 2 == 0, "head dimension must be positive and even (RoPE)");
  require(ffn > 0, "feed-forward width must be positive");
  require(rms_eps > 0, "rms_norm_eps must be positive");
  require(rope_theta > 0, "rope_theta must be positive");
  require(max_positions > 0, "maximum sequence length must be positive");
  require(mask_id >= 0 && mask_id < vocab, "mask token id must lie inside the vocabulary");
  require(eos_id < vocab && pad_id < vocab && bos_id < vocab, "special token ids must lie inside the vocabulary");
}

}  // namespace polestar
