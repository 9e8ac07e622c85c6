#include "model/gguf_convert.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"
#include "base/parallel.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "ops/quant.h"
#include "tokenizer/tokenizer_json.h"

namespace polestar {
namespace {

namespace fs = std::filesystem;

// llama.cpp's llama_ftype values, written as general.file_type.
uint32_t FileTypeId(GgufFileType type) {
  switch (type) {
    case GgufFileType::kF32:
      return 0;
    case GgufFileType::kF16:
      return 1;
    case GgufFileType::kBF16:
      return 32;
    case GgufFileType::kQ8_0:
      return 7;
    case GgufFileType::kQ4_0:
      return 2;
    case GgufFileType::kQ4_K_M:
      return 15;
  }
  return 0;
}

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One tensor to write: where it comes from and how.
struct TensorPlan {
  std::string gguf_name;
  // The source tensor, or one per expert for a stacked [E, rows, cols] tensor (llama.cpp
  // stacks the experts' matrices of a layer in expert order, as torch.stack(dim=0) does).
  std::vector<std::string> hf_names;
  std::vector<int64_t> shape;  // [rows, cols], [E, rows, cols] or [n]
  int permute_heads = 0;       // > 0: q/k rows regrouped per head for interleaved RoPE
};

// llama.cpp's LLaDA permute: within each of `heads` groups of D rows, output row 2i + j
// takes input row j * D/2 + i, so rotate-half pairs (i, i + D/2) become (2i, 2i + 1).
int64_t SourceRow(int64_t row, int64_t rows, int heads) {
  if (heads == 0) return row;
  const int64_t head_dim = rows / heads;
  const int64_t head = row / head_dim, within = row % head_dim;
  return head * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

// The checkpoint's tensors paired with their GGUF names, in llama.cpp's file order.
std::vector<TensorPlan> PlanTensors(const Architecture& arch, const ModelConfig& c) {
  // llama.cpp's converter regroups q/k rows where the GGUF layout runs interleaved RoPE on a
  // rotate-half checkpoint.
  const bool permute =
      arch.block.rope == RopeStyle::kRotateHalf && arch.gguf.rope == RopeStyle::kInterleaved;
  const std::vector<CheckpointTensor> hf = CheckpointTensors(c, arch.hf_tensors);
  const std::vector<CheckpointTensor> gguf = CheckpointTensors(c, arch.gguf_tensors);
  // Both lists walk the same tensors in the same order; a stacked GGUF tensor stands for
  // the next E per-expert Hugging Face ones.
  std::vector<TensorPlan> plan;
  size_t next = 0;
  for (const CheckpointTensor& out : gguf) {
    const bool stacked = out.shape.size() == 3;
    const size_t sources = stacked ? size_t(c.moe.experts) : 1;
    PS_CHECK(next + sources <= hf.size());
    TensorPlan t{out.name, {}, hf[next].shape, permute ? hf[next].rope_heads : 0};
    for (size_t i = next; i < next + sources; ++i) t.hf_names.push_back(hf[i].name);
    if (stacked) t.shape.insert(t.shape.begin(), c.moe.experts);
    PS_CHECK(t.shape == out.shape);
    plan.push_back(std::move(t));
    next += sources;
  }
  PS_CHECK(next == hf.size());
  return plan;
}

// The {arch}.* keys of a mixture of experts. llama.cpp's LLaDA-MoE converter writes the
// expert count, top-k and expert width; which layers route and whether there is a shared
// expert or an expert bias follow from the tensors a layer has (the shared expert's width
// also goes in expert_shared_feed_forward_length, as for llama.cpp's Qwen2-MoE).
// Where the layout has llama.cpp's BailingMoeV2 router keys (LLaDA 2.x), they say how the
// router scores, renormalises, scales and groups, and how many leading layers are dense.
// expert_weights_norm records what the model computes (LLaDA 2.x's modeling code
// renormalises whenever k > 1, whatever norm_topk_prob says; the released configs have
// norm_topk_prob true and k = 8, where the two agree).
void AddMoeMetadata(GgufMetadata& meta, const Architecture& architecture, const ModelConfig& c,
                    const std::string& config_path) {
  const std::string& arch = architecture.name;
  const MoeConfig& moe = c.moe;
  meta.Add(arch + ".expert_count", GgufValue::U32(uint32_t(moe.experts)));
  meta.Add(arch + ".expert_used_count", GgufValue::U32(uint32_t(moe.experts_per_token)));
  meta.Add(arch + ".expert_feed_forward_length", GgufValue::U32(uint32_t(moe.expert_ffn)));
  if (moe.shared_ffn > 0) {
    meta.Add(arch + ".expert_shared_feed_forward_length", GgufValue::U32(uint32_t(moe.shared_ffn)));
  }
  if (!architecture.gguf.writes_router_keys) return;
  int dense_layers = 0;
  while (dense_layers < c.layers && !c.IsMoeLayer(dense_layers)) ++dense_layers;
  for (int l = dense_layers; l < c.layers; ++l) {
    if (!c.IsMoeLayer(l)) {
      Fail(config_path, ": layer ", l,
           " is dense after a routed layer; llama.cpp's layout has dense layers only first");
    }
  }
  meta.Add(arch + ".leading_dense_block_count", GgufValue::U32(uint32_t(dense_layers)));
  meta.Add(arch + ".expert_shared_count",
           GgufValue::U32(uint32_t(moe.expert_ffn > 0 ? moe.shared_ffn / moe.expert_ffn : 0)));
  meta.Add(arch + ".expert_weights_scale", GgufValue::F32(moe.routed_scaling));
  meta.Add(arch + ".expert_weights_norm", GgufValue::Bool(moe.normalize_top_k));
  // llama.cpp's llama_expert_gating_func_type: 1 softmax, 2 sigmoid.
  meta.Add(arch + ".expert_gating_func",
           GgufValue::U32(moe.score == RouterScore::kSigmoid ? 2u : 1u));
  meta.Add(arch + ".expert_group_count", GgufValue::U32(uint32_t(moe.groups)));
  meta.Add(arch + ".expert_group_used_count", GgufValue::U32(uint32_t(moe.top_groups)));
}

// The special ids: config.json's, which decoding uses (EOS and end of turn stop it, the mask
// is what it fills), so the file decodes as the folder does; the tokenizer's BOS where
// config.json has none (chat templates write bos_token). llama.cpp's vocabulary-less model
// ignores them; polestar's reader takes the model's ids from them either way.
void AddSpecialIds(GgufMetadata& meta, const ModelConfig& c, int tokenizer_bos) {
  auto add_id = [&](const char* key, int id) {
    if (id >= 0) meta.Add(key, GgufValue::U32(uint32_t(id)));
  };
  add_id("tokenizer.ggml.bos_token_id", c.bos_id >= 0 ? c.bos_id : tokenizer_bos);
  add_id("tokenizer.ggml.eos_token_id", c.eos_id);
  add_id("tokenizer.ggml.eot_token_id", c.eot_id);
  add_id("tokenizer.ggml.padding_token_id", c.pad_id);
  add_id("tokenizer.ggml.mask_token_id", c.mask_id);
}

// tokenizer.ggml.* and tokenizer.chat_template from the folder's tokenizer files, read as
// polestar reads them for the folder (so both tokenize alike), written as llama.cpp's gpt2
// vocabulary path writes them: ids the tokenizer does not use become "[PAD<id>]" of type
// UNUSED, added tokens CONTROL (special) or USER_DEFINED. Without a tokenizer.json, llama.cpp's
// vocabulary-less model ("none", with {arch}.vocab_size): a vocabulary of placeholders would
// be one llama.cpp refuses (a gpt2 model needs merges) and would tokenize text into nonsense.
void AddTokenizer(GgufMetadata& meta, const std::string& hf_dir, const Architecture& arch,
                  const ModelConfig& c, std::vector<std::string>& warnings) {
  if (!fs::exists(fs::path(hf_dir) / "tokenizer.json")) {
    meta.Add("tokenizer.ggml.model", GgufValue::String("none"));
    if (!arch.gguf.writes_vocab_size)
      meta.Add(arch.name + ".vocab_size", GgufValue::U32(uint32_t(c.vocab)));
    AddSpecialIds(meta, c, -1);
    return;
  }
  const TokenizerSpec spec = ReadTokenizerFiles(hf_dir, c.vocab);
  constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;
  std::vector<std::string> tokens(size_t(c.vocab));      // [V]
  std::vector<int32_t> types(size_t(c.vocab), kUnused);  // [V]
  for (size_t id = 0; id < spec.vocab.size(); ++id) {
    if (spec.vocab[id].empty()) continue;
    tokens[id] = spec.vocab[id];
    types[id] = kNormal;
  }
  for (const AddedToken& added : spec.added_tokens) {
    tokens[size_t(added.id)] = added.content;
    types[size_t(added.id)] = added.special ? kControl : kUserDefined;
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kUnused) tokens[id] = Cat("[PAD", id, "]");
  }
  std::vector<std::string> merges;
  for (const auto& [left, right] : spec.merges) merges.push_back(left + " " + right);
  std::string pre = GgufPreTokenizerName(spec, arch.gguf.tokenizer_pre);
  if (pre.empty()) {
    pre = arch.gguf.tokenizer_pre;
    warnings.push_back(Cat(spec.source,
                           ": the pre-tokenizer is none polestar can name for llama.cpp; wrote ",
                           arch.name, "'s \"", pre, "\", which may split text differently"));
  }
  meta.Add("tokenizer.ggml.model", GgufValue::String("gpt2"));
  meta.Add("tokenizer.ggml.pre", GgufValue::String(pre));
  meta.Add("tokenizer.ggml.tokens", GgufValue::Strings(tokens));
  meta.Add("tokenizer.ggml.token_type", GgufValue::I32s(types));
  // llama.cpp refuses a gpt2 vocabulary without the key, even when there are no merges.
  meta.Add("tokenizer.ggml.merges", GgufValue::Strings(merges));
  const auto bos = std::find(tokens.begin(), tokens.end(), spec.bos_token);
  AddSpecialIds(meta, c,
                spec.bos_token.empty() || bos == tokens.end() ? -1 : int(bos - tokens.begin()));
  // tokenizer_config.json's flags; without them, what the architecture's tokenizer does.
  bool add_bos = arch.gguf.adds_bos_token, add_eos = false;
  const fs::path config_path = fs::path(hf_dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    const nlohmann::json config = ReadJsonFile(config_path.string());
    auto flag = [&](const char* key, bool& value) {
      if (!config.contains(key) || config[key].is_null()) return;
      if (!config[key].is_boolean())
        Fail(config_path.string(), ": \"", key, "\" must be true or false");
      value = config[key].get<bool>();
    };
    flag("add_bos_token", add_bos);
    flag("add_eos_token", add_eos);
  }
  meta.Add("tokenizer.ggml.add_bos_token", GgufValue::Bool(add_bos));
  meta.Add("tokenizer.ggml.add_eos_token", GgufValue::Bool(add_eos));
  meta.Add(kGgufCleanUpSpacesKey, GgufValue::Bool(spec.clean_up_tokenization_spaces));
  if (!spec.chat_template.empty())
    meta.Add("tokenizer.chat_template", GgufValue::String(spec.chat_template));
}

// generation_config.json as JSON text under kGgufGenerationConfigKey: polestar reads it back
// as it reads the folder's file (llama.cpp's general.sampling.* keys have no place for a
// diffusion model's lengths, steps and thresholds).
void AddGenerationConfig(GgufMetadata& meta, const std::string& hf_dir) {
  const fs::path path = fs::path(hf_dir) / "generation_config.json";
  if (!fs::exists(path)) return;
  const nlohmann::json config = ReadJsonFile(path.string());
  if (!config.is_object()) Fail(path.string(), ": not a JSON object");
  meta.Add(kGgufGenerationConfigKey, GgufValue::String(config.dump()));
}

}  // namespace

GgufFileType ParseGgufFileType(const std::string& name) {
  if (name == "f32") return GgufFileType::kF32;
  if (name == "f16") return GgufFileType::kF16;
  if (name == "bf16") return GgufFileType::kBF16;
  if (name == "q8_0") return GgufFileType::kQ8_0;
  if (name == "q4_0") return GgufFileType::kQ4_0;
  if (name == "q4_k_m") return GgufFileType::kQ4_K_M;
  Fail("unknown GGUF type '", name, "' (f32, f16, bf16, q8_0, q4_0, q4_k_m)");
}

DType GgufTensorType(GgufFileType file_type, const std::string& name, int64_t width,
                     bool is_vector) {
  // llama.cpp keeps the router in F32 (its converter forces FFN_GATE_INP to F32 and
  // llama-quant never quantises ffn_gate_inp).
  if (is_vector || EndsWith(name, ".ffn_gate_inp.weight")) return DType::kF32;
  auto fits = [&](DType type) { return width % BlockSize(type) == 0; };
  auto or_fallback = [&](DType type) {
    if (fits(type)) return type;
    return fits(DType::kQ8_0) ? DType::kQ8_0 : DType::kF16;
  };
  switch (file_type) {
    case GgufFileType::kF32:
      return DType::kF32;
    case GgufFileType::kF16:
      return DType::kF16;
    case GgufFileType::kBF16:
      return DType::kBF16;
    case GgufFileType::kQ8_0:
      return fits(DType::kQ8_0) ? DType::kQ8_0 : DType::kF16;
    case GgufFileType::kQ4_0:
      return name == "output.weight" ? or_fallback(DType::kQ6_K)
                                     : (fits(DType::kQ4_0) ? DType::kQ4_0 : DType::kF16);
    case GgufFileType::kQ4_K_M: {
      // llama-quant matches "ffn_down" as a substring, so routed (ffn_down_exps) and
      // shared (ffn_down_shexp) experts' down projections go with the dense one.
      const bool sensitive = name == "output.weight" || EndsWith(name, ".attn_v.weight") ||
                             name.find(".ffn_down") != std::string::npos;
      // A fused q/k/v (LLaDA 2.x's attn_qkv) holds attn_v's rows: llama-quant gives it Q5_K.
      if (EndsWith(name, ".attn_qkv.weight")) return or_fallback(DType::kQ5_K);
      return or_fallback(sensitive ? DType::kQ6_K : DType::kQ4_K);
    }
  }
  return DType::kF32;
}

std::vector<std::string> ConvertToGguf(const std::string& hf_dir, const std::string& out_path,
                                       GgufFileType type,
                                       const std::function<void(const std::string&)>& log) {
  const std::string config_path = (fs::path(hf_dir) / "config.json").string();
  if (!fs::exists(config_path)) Fail(hf_dir, ": no config.json");
  // Every file of the checkpoint folder is read (weights, config, tokenizer).
  std::vector<std::string> inputs;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(hf_dir, ec)) {
    if (entry.is_regular_file(ec)) inputs.push_back(entry.path().string());
  }
  FailIfOutputIsAnInput(out_path, inputs);
  const nlohmann::json raw = ReadJsonFile(config_path);
  const Architecture& architecture = ArchitectureOfHfConfig(raw, config_path);
  const ModelConfig c = ParseHfConfig(architecture, raw, config_path);
  const std::string& context_key = architecture.gguf.context_length_key;
  const int64_t context_length = raw.contains(context_key) && raw[context_key].is_number_integer()
                                     ? raw[context_key].get<int64_t>()
                                     : c.max_positions;
  const TensorStore store = ReadSafetensorsDir(hf_dir);

  GgufWriter writer;
  GgufMetadata& meta = writer.metadata();
  const std::string& arch = architecture.name;
  auto key = [&](const char* leaf) { return arch + "." + leaf; };
  std::string name = fs::path(hf_dir).filename().string();
  if (name.empty()) name = fs::path(hf_dir).parent_path().filename().string();
  meta.Add("general.architecture", GgufValue::String(arch));
  meta.Add("general.type", GgufValue::String("model"));
  meta.Add("general.name", GgufValue::String(name));
  meta.Add(key("block_count"), GgufValue::U32(uint32_t(c.layers)));
  meta.Add(key("context_length"), GgufValue::U32(uint32_t(context_length)));
  meta.Add(key("embedding_length"), GgufValue::U32(uint32_t(c.width)));
  meta.Add(key("feed_forward_length"), GgufValue::U32(uint32_t(c.ffn)));
  meta.Add(key("attention.head_count"), GgufValue::U32(uint32_t(c.heads)));
  meta.Add(key("attention.head_count_kv"), GgufValue::U32(uint32_t(c.kv_heads)));
  meta.Add(key("rope.freq_base"), GgufValue::F32(c.rope_theta));
  meta.Add(key("attention.layer_norm_rms_epsilon"), GgufValue::F32(c.rms_eps));
  meta.Add("general.file_type", GgufValue::U32(FileTypeId(type)));
  if (architecture.gguf.writes_vocab_size)
    meta.Add(key("vocab_size"), GgufValue::U32(uint32_t(c.vocab)));
  meta.Add(key("rope.dimension_count"), GgufValue::U32(uint32_t(c.rotary_dim)));
  if (architecture.gguf.writes_head_dim) {
    meta.Add(key("attention.key_length"), GgufValue::U32(uint32_t(c.head_dim)));
    meta.Add(key("attention.value_length"), GgufValue::U32(uint32_t(c.head_dim)));
  }
  meta.Add(key("attention.causal"), GgufValue::Bool(false));
  // llama.cpp's clamp key (OLMo, DBRX); only a checkpoint with clip_qkv (LLaDA-MoE) has one.
  if (c.clip_qkv > 0) meta.Add(key("attention.clamp_kqv"), GgufValue::F32(c.clip_qkv));
  if (architecture.gguf.writes_shift_logits)
    meta.Add("diffusion.shift_logits", GgufValue::Bool(c.shift_logits));
  if (c.moe.experts > 0) AddMoeMetadata(meta, architecture, c, config_path);
  meta.Add("general.quantization_version", GgufValue::U32(2));
  std::vector<std::string> warnings;
  AddTokenizer(meta, hf_dir, architecture, c, warnings);
  AddGenerationConfig(meta, hf_dir);

  const std::vector<TensorPlan> plan = PlanTensors(architecture, c);
  std::vector<DType> out_types;
  for (const TensorPlan& t : plan) {
    // A stacked tensor's sources are each one [rows, cols] slice of it.
    const std::vector<int64_t> source_shape(t.shape.end() - std::min<size_t>(t.shape.size(), 2),
                                            t.shape.end());
    for (const std::string& hf_name : t.hf_names) {
      const TensorRef& source = store.Get(hf_name);
      if (source.shape != source_shape) {
        std::string expected;
        for (int64_t d : source_shape)
          expected += (expected.empty() ? "" : ", ") + std::to_string(d);
        Fail(store.origin(), ": tensor '", hf_name, "' does not have the shape [", expected,
             "] that config.json implies");
      }
      if (source.dtype != DType::kF32 && source.dtype != DType::kF16 &&
          source.dtype != DType::kBF16) {
        Fail(store.origin(), ": tensor '", hf_name, "' has type ", DTypeName(source.dtype),
             " (F32, F16 or BF16 expected)");
      }
    }
    out_types.push_back(GgufTensorType(type, t.gguf_name, t.shape.back(), t.shape.size() == 1));
    writer.AddTensor(t.gguf_name, out_types.back(), t.shape);
  }
  writer.Open(out_path);
  for (size_t i = 0; i < plan.size(); ++i) {
    const TensorPlan& t = plan[i];
    // A vector is converted as `n` rows of one value, which permutes biases like rows.
    const bool vector = t.shape.size() == 1;
    const int64_t cols = vector ? 1 : t.shape.back();
    const int64_t source_rows = vector ? t.shape[0] : t.shape[t.shape.size() - 2];
    const int64_t rows = source_rows * int64_t(t.hf_names.size());  // all slices together
    const DType out_type = out_types[i];
    const int64_t out_row_bytes = RowBytes(out_type, cols);
    std::vector<uint8_t> out(size_t(rows * out_row_bytes));  // the tensor as written
    std::vector<const TensorRef*> sources;                   // [slices]
    for (const std::string& hf_name : t.hf_names) sources.push_back(&store.Get(hf_name));
    // Chunks of at least 64K values, so small tensors are converted without waking threads.
    ParallelFor(rows, std::max<int64_t>(1, 65536 / cols), [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));  // [K]
      for (int64_t r = begin; r < end; ++r) {
        const TensorRef& source = *sources[size_t(r / source_rows)];
        const int64_t from = SourceRow(r % source_rows, source_rows, t.permute_heads);
        DequantizeValues(source.dtype, source.data + from * cols * BlockBytes(source.dtype), cols,
                         row.data());
        QuantizeValues(out_type, row.data(), cols, out.data() + r * out_row_bytes);
      }
    });
    writer.WriteTensorData(out.data(), out.size());
    if (log) {
      const TensorRef& first = *sources.front();
      log(Cat(t.gguf_name, " <- ", t.hf_names.front(),
              t.hf_names.size() > 1 ? Cat(" (+", t.hf_names.size() - 1, " experts)") : "", " ",
              DTypeName(first.dtype), " -> ", DTypeName(out_type)));
    }
  }
  writer.Close();
  return warnings;
}

}  // namespace polestar
