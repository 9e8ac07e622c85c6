// Hugging Face checkpoint (any registered architecture, safetensors) -> GGUF, laid out as
// llama.cpp's converter writes it: {arch}.* keys (LLaDA 2.x: its BailingMoeV2 router and
// head-dimension keys too), blk.N.* tensor names in ggml order, q/k
// rows permuted where the architecture's GGUF layout runs interleaved RoPE (LLaDA), norms,
// biases and MoE routers in F32, each layer's routed experts stacked into one [E, rows, cols]
// tensor per matrix (ggml ne = [cols, rows, E]) with the {arch}.expert_* keys, the tokenizer
// in tokenizer.ggml.* and tokenizer.chat_template (llama.cpp's keys), the decoding defaults
// of generation_config.json in kGgufGenerationConfigKey. Quantisation reproduces ggml's
// reference quantisers, so F16 / BF16 / Q8_0 / Q4_0 output matches llama.cpp's byte for byte;
// F32 keeps the checkpoint's values, so the file computes the folder's logits.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace polestar {

enum class GgufFileType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K_M };

// The key holding a converted folder's generation_config.json, as JSON text.
inline constexpr char kGgufGenerationConfigKey[] = "polestar.generation_config";

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m"; throws Error for anything else.
GgufFileType ParseGgufFileType(const std::string& name);

// The type a tensor gets in a file of type `file_type` (llama.cpp's choices): vectors F32;
// MoE routers (ffn_gate_inp) F32; Q4_K_M uses Q6_K for output, attn_v and every ffn_down
// (dense, routed ffn_down_exps, shared ffn_down_shexp), Q5_K for a fused attn_qkv (LLaDA
// 2.x) and Q4_K elsewhere; Q4_0 keeps output
// in Q6_K. Rows whose width does not fit the block size fall back to Q8_0, then F16.
DType GgufTensorType(GgufFileType file_type, const std::string& gguf_name, int64_t rows_width,
                     bool is_vector);

// Converts the checkpoint folder `hf_dir` (config.json, safetensors, and tokenizer.json /
// tokenizer_config.json / chat_template.jinja / generation_config.json when present) into
// `out_path`. A folder without tokenizer.json gives llama.cpp's vocabulary-less model
// (tokenizer.ggml.model "none"). `log` receives one line per tensor. Returns warnings: what
// the file cannot say as the folder does (a pre-tokenizer with no llama.cpp name known here).
std::vector<std::string> ConvertToGguf(const std::string& hf_dir, const std::string& out_path,
                                       GgufFileType type,
                                       const std::function<void(const std::string&)>& log = {});

}  // namespace polestar
