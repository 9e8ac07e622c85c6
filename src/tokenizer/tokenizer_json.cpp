#include "tokenizer/tokenizer_json.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "io/json_file.h"

namespace polestar {

namespace {

using nlohmann::json;

// Qwen2 / Dream (model_specs.md §4.1): single digits.
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3: up to three digits.
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Bailing / Ling, the family of LLaDA's tokenizer (llama.cpp's BAILINGMOE, model_specs.md §4.2).
constexpr char kBailingPattern[] =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

// The member `key` of an object, or null; unlike json::value() it does not copy.
const json& Member(const json& node, const char* key) {
  static const json kNull;
  if (!node.is_object()) return kNull;
  auto it = node.find(key);
  return it == node.end() ? kNull : *it;
}

bool GetBool(const json& node, const char* key, bool fallback, const std::string& where) {
  auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) Fail(where, ": \"", key, "\" must be true or false");
  return it->get<bool>();
}

std::string GetString(const json& node, const char* key, const std::string& where) {
  auto it = node.find(key);
  if (it == node.end() || it->is_null()) return "";
  if (!it->is_string()) Fail(where, ": \"", key, "\" must be a string");
  return it->get<std::string>();
}

// Sequences nest; real files use one level, and the recursion must stay bounded.
constexpr int kMaxSequenceDepth = 16;

// The "type" of a component; `component` names it in the Error for a non-object.
std::string TypeOf(const json& node, const char* component, const std::string& where) {
  if (!node.is_object()) Fail(where, ": ", component, " must be an object with a \"type\"");
  return GetString(node, "type", where);
}

void CheckDepth(int depth, const char* component, const std::string& where) {
  if (depth > kMaxSequenceDepth) {
    Fail(where, ": ", component, " Sequences nest more than ", kMaxSequenceDepth, " deep");
  }
}

// `node` as a token id below `id_limit`; the Error otherwise names the `kind` of token (the
// message is built only then: vocabularies have 10^5 entries).
int TokenId(const json& node, const char* kind, const std::string& token, const std::string& where,
            int id_limit) {
  // Unsigned first: a value above INT64_MAX must not wrap to a small signed one.
  if (node.is_number_unsigned() && node.get<uint64_t>() < uint64_t(id_limit)) {
    return int(node.get<uint64_t>());
  }
  if (node.is_number_integer() && !node.is_number_unsigned() && node.get<int64_t>() >= 0 &&
      node.get<int64_t>() < id_limit) {
    return int(node.get<int64_t>());
  }
  if (node.is_number()) {
    Fail(where, ": ", kind, " \"", token, "\" has id ", node.dump(), ", not an integer in [0, ",
         id_limit, ")");
  }
  Fail(where, ": ", kind, " \"", token, "\" has an id that is ", node.type_name(),
       ", not an integer");
}

void ParseNormalizer(const json& node, const std::string& where, TokenizerSpec& spec,
                     int depth = 0) {
  if (node.is_null()) return;
  const std::string type = TypeOf(node, "normalizer", where);
  if (type == "Sequence") {
    CheckDepth(depth, "normalizer", where);
    const json& list = Member(node, "normalizers");
    if (!list.is_array()) Fail(where, ": normalizer Sequence needs a \"normalizers\" list");
    for (const json& child : list) ParseNormalizer(child, where, spec, depth + 1);
  } else if (type == "NFC") {
    spec.normalizers.push_back(unicode::NormalForm::kNfc);
  } else if (type == "NFD") {
    spec.normalizers.push_back(unicode::NormalForm::kNfd);
  } else if (type == "NFKC") {
    spec.normalizers.push_back(unicode::NormalForm::kNfkc);
  } else if (type == "NFKD") {
    spec.normalizers.push_back(unicode::NormalForm::kNfkd);
  } else {
    Fail(where, ": normalizer type \"", type,
         "\" is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)");
  }
}

SplitBehavior ParseBehavior(const std::string& name, const std::string& where) {
  // transformers.js accepts any letter case here.
  std::string lower;
  for (char c : name) lower += char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "removed") return SplitBehavior::kRemoved;
  if (lower == "isolated") return SplitBehavior::kIsolated;
  if (lower == "mergedwithprevious") return SplitBehavior::kMergedWithPrevious;
  if (lower == "mergedwithnext") return SplitBehavior::kMergedWithNext;
  if (lower == "contiguous") return SplitBehavior::kContiguous;
  Fail(where, ": Split behavior \"", name, "\" is unknown");
}

void ParsePreTokenizer(const json& node, const std::string& where, TokenizerSpec& spec,
                       int depth = 0) {
  if (node.is_null()) return;
  const std::string type = TypeOf(node, "pre_tokenizer", where);
  if (type == "Sequence") {
    CheckDepth(depth, "pre_tokenizer", where);
    const json& list = Member(node, "pretokenizers");
    if (!list.is_array()) Fail(where, ": pre_tokenizer Sequence needs a \"pretokenizers\" list");
    for (const json& child : list) ParsePreTokenizer(child, where, spec, depth + 1);
  } else if (type == "Split") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kSplit;
    const json& pattern = Member(node, "pattern");
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.pattern = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.pattern = pattern["String"].get<std::string>();
      step.pattern_is_regex = false;
    } else {
      Fail(where, ": Split pre-tokenizer needs a pattern {\"Regex\": ...} or {\"String\": ...}");
    }
    step.behavior = ParseBehavior(GetString(node, "behavior", where), where);
    step.invert = GetBool(node, "invert", false, where);
    spec.pre_tokenizers.push_back(step);
  } else if (type == "ByteLevel") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = GetBool(node, "add_prefix_space", false, where);
    step.use_regex = GetBool(node, "use_regex", true, where);
    spec.pre_tokenizers.push_back(step);
  } else {
    Fail(where, ": pre-tokenizer type \"", type,
         "\" is not supported (supported: Split, ByteLevel, Sequence)");
  }
}

void ParseDecoder(const json& node, const std::string& where, TokenizerSpec& spec, int depth = 0) {
  const std::string type = node.is_null() ? "null" : TypeOf(node, "decoder", where);
  if (type == "Sequence") {
    CheckDepth(depth, "decoder", where);
    const json& list = Member(node, "decoders");
    if (!list.is_array()) Fail(where, ": decoder Sequence needs a \"decoders\" list");
    for (const json& child : list) ParseDecoder(child, where, spec, depth + 1);
  } else if (type == "ByteLevel") {
    spec.decode_byte_level = true;
  } else if (type == "ByteFallback") {
    spec.decode_byte_fallback = true;
  } else if (type == "Fuse") {
    // Joining token strings is what decoding does anyway.
  } else {
    Fail(where, ": decoder type \"", type,
         "\" is not supported (supported: ByteLevel, ByteFallback, Fuse, Sequence)");
  }
}

void ParseModel(const json& model, const std::string& where, TokenizerSpec& spec) {
  if (!model.is_object()) Fail(where, ": \"model\" is missing");
  const std::string type = model.contains("type") ? GetString(model, "type", where) : "BPE";
  if (type != "BPE") Fail(where, ": model type \"", type, "\" is not supported (only BPE)");
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0) {
    Fail(where, ": BPE dropout is not supported (it makes encoding random)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!GetString(model, key, where).empty()) Fail(where, ": BPE ", key, " is not supported");
  }
  spec.ignore_merges = GetBool(model, "ignore_merges", false, where);
  spec.byte_fallback = GetBool(model, "byte_fallback", false, where);
  spec.fuse_unk = GetBool(model, "fuse_unk", false, where);
  spec.unk_token = GetString(model, "unk_token", where);

  const json& vocab = Member(model, "vocab");
  if (!vocab.is_object()) Fail(where, ": BPE \"vocab\" must be an object of token -> id");
  // Ids are checked before the table is sized by the highest one. Most vocabularies list
  // their ids in order, so the table grows as entries arrive.
  spec.vocab.reserve(std::min(vocab.size(), size_t(spec.id_limit)));
  for (const auto& [token, id_node] : vocab.items()) {
    const auto id = size_t(TokenId(id_node, "vocabulary token", token, where, spec.id_limit));
    if (token.empty()) Fail(where, ": the vocabulary has an empty token (id ", id, ")");
    if (id >= spec.vocab.size()) spec.vocab.resize(id + 1);
    if (!spec.vocab[id].empty()) {
      Fail(where, ": vocabulary id ", id, " is given to both \"", spec.vocab[id], "\" and \"",
           token, "\"");
    }
    spec.vocab[id] = token;
  }

  const json& merges = Member(model, "merges");
  if (!merges.is_array() && !merges.is_null()) Fail(where, ": BPE \"merges\" must be a list");
  spec.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    if (merge.is_string()) {
      // Legacy form "a b": byte-level tokens never contain a plain space.
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos) {
        Fail(where, ": merge ", rank, " \"", line, "\" is not two tokens separated by one space");
      }
      spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      Fail(where, ": merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
}

// A special token in tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::string TokenValue(const json& value, const std::string& key, const std::string& where) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  Fail(where, ": \"", key, "\" must be a string or an object with \"content\"");
}

std::string ConfigToken(const json& config, const char* key, const std::string& where) {
  auto it = config.find(key);
  return it == config.end() ? "" : TokenValue(*it, key, where);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

TokenizerSpec ParseTokenizerJson(const json& tokenizer, const std::string& where, int id_limit) {
  if (!tokenizer.is_object()) Fail(where, ": not a tokenizer.json object");
  TokenizerSpec spec;
  spec.source = where;
  spec.id_limit = std::clamp(id_limit, 0, kMaxTokenIds);
  ParseModel(Member(tokenizer, "model"), where, spec);
  spec.decode_byte_level = false;
  ParseNormalizer(Member(tokenizer, "normalizer"), where, spec);
  ParsePreTokenizer(Member(tokenizer, "pre_tokenizer"), where, spec);
  ParseDecoder(Member(tokenizer, "decoder"), where, spec);
  const json& added = Member(tokenizer, "added_tokens");
  if (!added.is_array() && !added.is_null()) Fail(where, ": \"added_tokens\" must be a list");
  for (const json& entry : added) {
    if (!entry.is_object() || !entry.contains("id") || !entry.contains("content") ||
        !entry["content"].is_string()) {
      Fail(where, ": every added token needs an integer \"id\" and a string \"content\"");
    }
    AddedToken token;
    token.content = entry["content"].get<std::string>();
    token.id = TokenId(entry["id"], "added token", token.content, where, spec.id_limit);
    token.special = GetBool(entry, "special", false, where);
    token.normalized = GetBool(entry, "normalized", !token.special, where);
    token.lstrip = GetBool(entry, "lstrip", false, where);
    token.rstrip = GetBool(entry, "rstrip", false, where);
    token.single_word = GetBool(entry, "single_word", false, where);
    spec.added_tokens.push_back(token);
  }
  return spec;
}

void ApplyTokenizerConfig(const json& config, const std::string& where, TokenizerSpec& spec) {
  if (!config.is_object()) Fail(where, ": not a JSON object");
  spec.bos_token = ConfigToken(config, "bos_token", where);
  spec.eos_token = ConfigToken(config, "eos_token", where);
  spec.pad_token = ConfigToken(config, "pad_token", where);
  spec.mask_token = ConfigToken(config, "mask_token", where);
  spec.config_unk_token = ConfigToken(config, "unk_token", where);
  if (auto it = config.find("additional_special_tokens"); it != config.end() && !it->is_null()) {
    if (!it->is_array()) Fail(where, ": \"additional_special_tokens\" must be a list");
    for (const json& value : *it) {
      spec.additional_special_tokens.push_back(
          TokenValue(value, "additional_special_tokens", where));
    }
  }
  // The reference treats a missing flag as true.
  spec.clean_up_tokenization_spaces = GetBool(config, "clean_up_tokenization_spaces", true, where);
  if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      spec.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // A list of named templates; the engine formats plain chats, i.e. "default".
      for (const json& entry : *it) {
        if (!entry.is_object()) Fail(where, ": \"chat_template\" list entries must be objects");
        if (GetString(entry, "name", where) == "default") {
          spec.chat_template = GetString(entry, "template", where);
        }
      }
    } else {
      Fail(where, ": \"chat_template\" must be a string or a list of named templates");
    }
  }
}

TokenizerSpec ReadTokenizerFiles(const std::string& path, int id_limit) {
  namespace fs = std::filesystem;
  const fs::path given(path);
  const fs::path file = fs::is_directory(given) ? given / "tokenizer.json" : given;
  if (!fs::exists(file)) {
    Fail(path, ": no tokenizer.json", fs::is_directory(given) ? " in this folder" : "");
  }
  TokenizerSpec spec = ParseTokenizerJson(ReadJsonFile(file.string()), file.string(), id_limit);
  const fs::path folder = file.parent_path();
  const fs::path config = folder / "tokenizer_config.json";
  if (fs::exists(config)) {
    ApplyTokenizerConfig(ReadJsonFile(config.string()), config.string(), spec);
  } else {
    spec.clean_up_tokenization_spaces = true;  // the reference default without a config
  }
  const fs::path jinja = folder / "chat_template.jinja";
  if (spec.chat_template.empty() && fs::exists(jinja))
    spec.chat_template = ReadText(jinja.string());
  return spec;
}

void SetGgufPipeline(std::string_view pre, const std::string& where, TokenizerSpec& spec) {
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  byte_level.use_regex = false;
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  // ignore_merges and clean-up as llama.cpp's llama_vocab::load sets them per name.
  spec.clean_up_tokenization_spaces = false;
  if (pre == "qwen2") {
    spec.normalizers = {unicode::NormalForm::kNfc};
    split.pattern = kQwen2Pattern;
  } else if (pre == "llama-bpe" || pre == "llama3") {
    split.pattern = kLlama3Pattern;
    spec.ignore_merges = true;
    spec.clean_up_tokenization_spaces = true;
  } else if (pre == "bailingmoe" || pre == "bailingmoe2" || pre == "llada-moe") {
    // llama.cpp reads LLaDA-MoE's and LLaDA 2.x's names as Ling's BailingMoE pre-tokenizer.
    split.pattern = kBailingPattern;
  } else if (pre == "gpt-2" || pre == "gpt2" || pre == "default") {
    spec.clean_up_tokenization_spaces = true;
    byte_level.use_regex = true;
    spec.pre_tokenizers = {byte_level};
    return;
  } else {
    Fail(where, ": GGUF pre-tokenizer \"", pre,
         "\" is not supported (supported: qwen2, llama-bpe, bailingmoe, bailingmoe2, llada-moe, "
         "gpt-2)");
  }
  spec.pre_tokenizers = {split, byte_level};
}

TokenizerSpec SpecFromGguf(const GgufVocab& gguf, const std::string& where) {
  TokenizerSpec spec;
  spec.source = where;
  SetGgufPipeline(gguf.pre, where, spec);
  if (!gguf.token_types.empty() && gguf.token_types.size() != gguf.tokens.size()) {
    Fail(where, ": ", gguf.tokens.size(), " tokens but ", gguf.token_types.size(), " token types");
  }
  constexpr int32_t kControl = 3, kUserDefined = 4, kUnused = 5;
  spec.vocab.resize(gguf.tokens.size());
  for (size_t id = 0; id < gguf.tokens.size(); ++id) {
    const int32_t type = gguf.token_types.empty() ? 1 : gguf.token_types[id];
    if (type == kUnused) continue;
    if (type == kControl || type == kUserDefined) {
      AddedToken token;
      token.id = int(id);
      token.content = gguf.tokens[id];
      token.special = type == kControl;
      spec.added_tokens.push_back(token);
    } else {
      spec.vocab[id] = gguf.tokens[id];
    }
  }
  for (size_t rank = 0; rank < gguf.merges.size(); ++rank) {
    const std::string& line = gguf.merges[rank];
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      Fail(where, ": merge ", rank, " \"", line, "\" is not two tokens separated by one space");
    }
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  auto name = [&](int id, const char* what) {
    if (id < 0) return std::string();
    if (size_t(id) >= gguf.tokens.size())
      Fail(where, ": ", what, " token id ", id, " is out of range");
    return gguf.tokens[size_t(id)];
  };
  spec.bos_token = name(gguf.bos_id, "bos");
  spec.eos_token = name(gguf.eos_id, "eos");
  spec.pad_token = name(gguf.pad_id, "padding");
  spec.mask_token = name(gguf.mask_id, "mask");
  spec.chat_template = gguf.chat_template;
  return spec;
}

std::string GgufPreTokenizerName(const TokenizerSpec& spec, std::string_view preferred) {
  // llama.cpp's converter names the pre-tokenizer by hashing a probe tokenisation; here it is
  // the name whose pipeline, as SetGgufPipeline builds it, is the tokenizer's own.
  for (std::string_view name : {preferred, std::string_view("gpt-2"), std::string_view("llama-bpe"),
                                std::string_view("qwen2"), std::string_view("bailingmoe")}) {
    if (name.empty()) continue;
    TokenizerSpec candidate;
    SetGgufPipeline(name, spec.source, candidate);
    if (candidate.normalizers == spec.normalizers &&
        candidate.pre_tokenizers == spec.pre_tokenizers &&
        candidate.ignore_merges == spec.ignore_merges) {
      return std::string(name);
    }
  }
  return "";
}

}  // namespace polestar
