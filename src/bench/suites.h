// A benchmark suite as the harness needs it: items as prompt token ids and a grader that
// takes the generated canvas. It joins the text suites of src/eval (which know nothing of
// tokens) with the model's vocabulary through a TextCodec.
//
// Suites:
//   probe      the 120 test prompts of a model folder's reference.json (the llada-probe
//              fixture: 3-digit addition, reversal, sorting), graded by exact match of the
//              text before the first EOS. Its prompt ids come with the file.
//   tiny       polestar-tiny's task family (src/tasks) on its test split, --per-task items per
//              task (50), prompts in LLaDA's chat template, gen 32 in blocks of 8; needs
//              src/tasks and src/tokenizer. The trainer evaluates with it too (train/eval.h).
//   long       polestar-long's family the same way: 84 items per task (504 in all), gen 128 in
//              blocks of 32.
//   gsm8k, math500, humaneval, mbpp
//              src/eval's suites from data/; the prompt goes through the model's chat
//              template (or raw, --prompt-format raw); the completion (cut at EOS/EOT and the
//              suite's stop sequences) is graded by the suite.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eval/suite.h"
#include "model/config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace polestar::bench {

// Text <-> token ids for one model folder.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // The prompt ids of an evaluation item (chat template or raw text, as configured).
  virtual std::vector<int> EncodePrompt(const eval::EvalItem& item) const = 0;
  // The text of generated ids (special tokens dropped).
  virtual std::string Decode(std::span<const int> ids) const = 0;
};

// A character vocabulary: vocab.json {"chars": [...], "PAD": id, "P_LEN": n} as in the
// llada-probe fixture. Prompts are the raw text, left-padded with PAD to P_LEN.
class CharVocabCodec final : public TextCodec {
 public:
  // Throws Error naming the file when it is missing or malformed.
  explicit CharVocabCodec(const std::string& vocab_json_path);
  std::vector<int> EncodePrompt(const eval::EvalItem& item) const override;
  std::vector<int> EncodeText(const std::string& text) const;
  std::string Decode(std::span<const int> ids) const override;

 private:
  std::string path_;
  std::vector<std::string> chars_;  // [id] -> character
  int pad_id_ = -1;
  int prompt_length_ = 0;
};

// How prompts of the text suites become ids: the model's chat template (a single user turn
// holding the whole prompt), the raw text, or chat when the tokenizer has a template.
enum class PromptFormat { kAuto, kChat, kRaw };

// A model's own tokenizer (tokenizer.json + tokenizer_config.json).
class TokenizerCodec final : public TextCodec {
 public:
  // Throws Error when chat is asked for and the tokenizer has no template that parses.
  TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer, PromptFormat format);
  std::vector<int> EncodePrompt(const eval::EvalItem& item) const override;
  std::string Decode(std::span<const int> ids) const override;
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;  // none: prompts are raw text
};
PromptFormat PromptFormatFromName(const std::string& name);  // auto | chat | raw
const char* PromptFormatName(PromptFormat format);

// The codec of a model: its tokenizer (tokenizer.json in a folder, or a GGUF file's), else a
// folder's character vocabulary (vocab.json). Throws Error when there is neither.
std::unique_ptr<TextCodec> LoadTextCodec(const std::string& model_dir, PromptFormat format);

struct BenchItem {
  std::string id;    // unique in the suite
  std::string task;  // per-task breakdown ("add", "rev"; the suite name for single-task suites)
  std::vector<int> prompt;
  std::string reference;  // the gold answer, for the record
};

struct ItemGrade {
  eval::GradeResult grade;
  std::string completion;  // the text that was graded
};

struct BenchSuite {
  std::string name;
  std::vector<BenchItem> items;           // after --limit / --shard (and --per-task for tiny, long)
  std::size_t full_size = 0;              // items in the whole test split
  std::vector<std::string> metric_names;  // primary first
  // Suggested canvas: used unless --gen-length / --block-length are given.
  int gen_length = 256;
  int block_length = 32;
  // Grades item `index` from its generated canvas (prompt excluded).
  std::function<ItemGrade(std::size_t index, std::span<const int> generated)> grade;
  // What identifies the selection, for result keys: name, limit, shard, n, seed, format.
  nlohmann::json selection;
};

struct SuiteOptions {
  std::string name;
  std::string model_dir;
  std::string data_dir;  // "" = eval::DefaultDataDir()
  std::size_t limit = 0;
  int shard_index = 0, shard_count = 1;
  int per_task = 0;                // tiny, long: items per task (0: 50 / 84)
  uint64_t seed = 0;               // tiny, long: generator seed of the test items
  std::vector<std::string> tasks;  // tiny, long: these tasks, in this order (empty: the family)
  PromptFormat prompt_format = PromptFormat::kAuto;
  eval::SandboxOptions sandbox;
};

std::vector<std::string> BenchSuiteNames();

// Throws Error for an unknown suite, missing files or a model folder the suite cannot use.
BenchSuite LoadBenchSuite(const SuiteOptions& options, const ModelConfig& config);

}  // namespace polestar::bench
