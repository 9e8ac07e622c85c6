#include "bench/suites.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "decode/generate.h"
#include "io/json_file.h"
#include "tasks/tasks.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/model_tokenizer.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

// The generated ids before the first end token (EOS / end of turn).
std::span<const int> UntilEnd(const ModelConfig& config, std::span<const int> generated) {
  size_t n = 0;
  while (n < generated.size() && !IsEndToken(config, generated[n])) ++n;
  return generated.first(n);
}

// The slice of a suite's items the options ask for (--limit, --shard).
eval::LoadOptions SliceOf(const SuiteOptions& options) {
  eval::LoadOptions load;
  load.limit = options.limit;
  load.shard_index = options.shard_index;
  load.shard_count = options.shard_count;
  load.sandbox = options.sandbox;
  return load;
}

// The task of a suite's item, for --limit to take items from every task.
template <typename Item>
std::string TaskOf(const Item& item) {
  return item.task;
}

// The grade of a suite with one right-or-wrong metric.
ItemGrade SingleMetricGrade(std::string completion, bool correct, const char* metric) {
  ItemGrade result;
  result.completion = std::move(completion);
  result.grade.correct = correct;
  result.grade.extracted = result.completion;
  result.grade.metrics = {{metric, correct, result.completion}};
  return result;
}

BenchSuite LoadProbeSuite(const SuiteOptions& options, const ModelConfig& config) {
  const std::string path = (fs::path(options.model_dir) / "reference.json").string();
  if (!fs::exists(path)) {
    Fail("suite probe: ", options.model_dir,
         " has no reference.json (the llada-probe fixture has one)");
  }
  const nlohmann::json reference = ReadJsonFile(path);
  if (!reference.contains("prompts") || !reference["prompts"].is_array()) {
    Fail(path, ": no prompts array");
  }
  auto codec =
      std::make_shared<CharVocabCodec>((fs::path(options.model_dir) / "vocab.json").string());
  std::vector<BenchItem> items;
  for (size_t i = 0; i < reference["prompts"].size(); ++i) {
    const nlohmann::json& p = reference["prompts"][i];
    if (!p.contains("prompt_ids") || !p.contains("answer") || !p.contains("task")) {
      Fail(path, ": prompt ", i, " lacks prompt_ids, answer or task");
    }
    BenchItem item;
    item.id = Cat("probe/", i);
    item.task = p["task"].get<std::string>();
    item.prompt = p["prompt_ids"].get<std::vector<int>>();
    item.reference = p["answer"].get<std::string>();
    items.push_back(std::move(item));
  }
  BenchSuite suite;
  suite.name = "probe";
  suite.full_size = items.size();
  suite.items = eval::LimitAndShard(std::move(items), SliceOf(options), TaskOf<BenchItem>);
  suite.metric_names = {"exact_match"};
  suite.gen_length = reference.value("gen_length", 32);
  suite.block_length = reference.value("block_length", 8);
  suite.grade = [codec, config, items = suite.items](size_t index, std::span<const int> generated) {
    std::string completion = codec->Decode(UntilEnd(config, generated));
    const bool correct = completion == items[index].reference;
    return SingleMetricGrade(std::move(completion), correct, "exact_match");
  };
  return suite;
}

// Test items per task when --per-task is not given: 500 items in each suite.
int DefaultPerTask(TaskFamily family) { return family == TaskFamily::kTiny ? 50 : 84; }

// The task suites: "tiny" (polestar-tiny's tasks, gen 32 in blocks of 8) and "long"
// (polestar-long's, gen 128 in blocks of 32), --per-task test items of each task.
BenchSuite LoadTaskSuite(const SuiteOptions& options, const ModelConfig& config,
                         TaskFamily family) {
  const std::string name = family == TaskFamily::kTiny ? "tiny" : "long";
  std::shared_ptr<TextCodec> codec = LoadTextCodec(options.model_dir, PromptFormat::kRaw);
  const auto* tokenizer = dynamic_cast<const TokenizerCodec*>(codec.get());
  if (tokenizer == nullptr) {
    Fail("suite ", name, ": ", options.model_dir, " has no tokenizer.json (the ", name,
         " suite is text in LLaDA's chat template)");
  }
  const int per_task = options.per_task > 0 ? options.per_task : DefaultPerTask(family);
  std::vector<TaskItem> tasks;
  std::vector<BenchItem> items;
  for (const std::string& task : options.tasks.empty() ? TaskNames(family) : options.tasks) {
    CheckTaskName(task);
    for (int i = 0; i < per_task; ++i) {
      TaskItem t = MakeTaskItem(task, Split::kTest, uint64_t(i), options.seed);
      // The chat template as the trainer wrote it, special tokens spelled out and split off
      // by the tokenizer.
      items.push_back(
          {Cat(task, "/", i), task, tokenizer->tokenizer().Encode(ChatPrompt(t.prompt)), t.answer});
      tasks.push_back(std::move(t));
    }
  }
  BenchSuite suite;
  suite.name = name;
  suite.full_size = items.size();
  suite.items = eval::LimitAndShard(std::move(items), SliceOf(options), TaskOf<BenchItem>);
  auto selected = std::make_shared<std::vector<TaskItem>>(
      eval::LimitAndShard(std::move(tasks), SliceOf(options), TaskOf<TaskItem>));
  suite.metric_names = {"correct"};
  suite.gen_length = family == TaskFamily::kTiny ? 32 : 128;
  suite.block_length = family == TaskFamily::kTiny ? 8 : 32;
  suite.grade = [codec, config, selected](size_t index, std::span<const int> generated) {
    std::string completion = codec->Decode(UntilEnd(config, generated));
    const bool correct = GradeAnswer((*selected)[index], completion);
    return SingleMetricGrade(std::move(completion), correct, "correct");
  };
  return suite;
}

BenchSuite LoadTextSuite(const SuiteOptions& options, const ModelConfig& config) {
  std::shared_ptr<TextCodec> codec = LoadTextCodec(options.model_dir, options.prompt_format);
  const eval::LoadOptions load = SliceOf(options);
  auto text_suite = std::make_shared<eval::Suite>(eval::LoadSuite(
      options.name, options.data_dir.empty() ? eval::DefaultDataDir() : options.data_dir, load));
  BenchSuite suite;
  suite.name = text_suite->name;
  suite.full_size = text_suite->full_size;
  suite.metric_names = text_suite->metric_names;
  for (const eval::EvalItem& e : text_suite->items) {
    suite.items.push_back({e.id, text_suite->name, codec->EncodePrompt(e), e.reference});
  }
  suite.gen_length = 256;
  suite.block_length = 32;
  suite.grade = [codec, config, text_suite](size_t index, std::span<const int> generated) {
    ItemGrade result;
    const std::string text = codec->Decode(UntilEnd(config, generated));
    result.completion = std::string(eval::TruncateAtStop(text, text_suite->stop_sequences));
    result.grade = text_suite->Grade(text_suite->items[index], result.completion);
    return result;
  };
  return suite;
}

}  // namespace

CharVocabCodec::CharVocabCodec(const std::string& path) : path_(path) {
  const nlohmann::json vocab = ReadJsonFile(path);
  if (!vocab.contains("chars") || !vocab["chars"].is_array()) Fail(path, ": no chars array");
  for (const nlohmann::json& c : vocab["chars"]) {
    if (!c.is_string()) Fail(path, ": chars must be strings");
    chars_.push_back(c.get<std::string>());
  }
  pad_id_ = vocab.value("PAD", -1);
  prompt_length_ = vocab.value("P_LEN", 0);
}

std::vector<int> CharVocabCodec::EncodeText(const std::string& text) const {
  std::vector<int> ids;
  for (char c : text) {
    const auto it = std::find(chars_.begin(), chars_.end(), std::string(1, c));
    if (it == chars_.end())
      Fail(path_, ": character '", std::string(1, c), "' of '", text, "' is not in the vocabulary");
    ids.push_back(int(it - chars_.begin()));
  }
  if (pad_id_ >= 0 && int(ids.size()) < prompt_length_) {
    ids.insert(ids.begin(), size_t(prompt_length_) - ids.size(), pad_id_);
  }
  return ids;
}

std::vector<int> CharVocabCodec::EncodePrompt(const eval::EvalItem& item) const {
  return EncodeText(item.prompt);
}

std::string CharVocabCodec::Decode(std::span<const int> ids) const {
  std::string text;
  for (int id : ids) {
    if (id >= 0 && size_t(id) < chars_.size()) text += chars_[size_t(id)];
  }
  return text;
}

TokenizerCodec::TokenizerCodec(std::unique_ptr<Tokenizer> tokenizer, PromptFormat format)
    : tokenizer_(std::move(tokenizer)) {
  const bool chat = format == PromptFormat::kChat ||
                    (format == PromptFormat::kAuto && !tokenizer_->chat_template().empty());
  // Parse the template now, so a tokenizer the engine cannot template fails before any work.
  if (chat) chat_template_.emplace(ChatTemplateFor(*tokenizer_));
}

std::vector<int> TokenizerCodec::EncodePrompt(const eval::EvalItem& item) const {
  if (!chat_template_) return tokenizer_->Encode(item.prompt);
  // The whole prompt, few-shot examples included, as one user turn (as Fast-dLLM and the
  // LLaDA evaluations give it to instruct models).
  return ApplyChatTemplate(*tokenizer_, {{"user", item.prompt}}, *chat_template_);
}

std::string TokenizerCodec::Decode(std::span<const int> ids) const {
  DetokenizeOptions options;
  options.skip_special_tokens = true;
  return tokenizer_->Decode(ids, options);
}

PromptFormat PromptFormatFromName(const std::string& name) {
  if (name == "auto") return PromptFormat::kAuto;
  if (name == "chat") return PromptFormat::kChat;
  if (name == "raw") return PromptFormat::kRaw;
  Fail("unknown prompt format '", name, "' (auto, chat, raw)");
}

const char* PromptFormatName(PromptFormat format) {
  switch (format) {
    case PromptFormat::kChat:
      return "chat";
    case PromptFormat::kRaw:
      return "raw";
    case PromptFormat::kAuto:
      break;
  }
  return "auto";
}

std::unique_ptr<TextCodec> LoadTextCodec(const std::string& model_dir, PromptFormat format) {
  const fs::path dir(model_dir);
  if (fs::is_directory(dir) && !fs::exists(dir / "tokenizer.json") &&
      fs::exists(dir / "vocab.json")) {
    return std::make_unique<CharVocabCodec>((dir / "vocab.json").string());
  }
  return std::make_unique<TokenizerCodec>(LoadModelTokenizer(model_dir), format);
}

std::vector<std::string> BenchSuiteNames() {
  std::vector<std::string> names = {"tiny", "long", "probe"};
  for (const std::string& name : eval::SuiteNames()) names.push_back(name);
  return names;
}

BenchSuite LoadBenchSuite(const SuiteOptions& options, const ModelConfig& config) {
  BenchSuite suite;
  if (options.name == "probe") {
    suite = LoadProbeSuite(options, config);
  } else if (options.name == "tiny") {
    suite = LoadTaskSuite(options, config, TaskFamily::kTiny);
  } else if (options.name == "long") {
    suite = LoadTaskSuite(options, config, TaskFamily::kLong);
  } else {
    const std::vector<std::string> text = eval::SuiteNames();
    if (std::find(text.begin(), text.end(), options.name) == text.end()) {
      std::string known;
      for (const std::string& n : BenchSuiteNames()) known += (known.empty() ? "" : ", ") + n;
      Fail("unknown suite '", options.name, "' (known: ", known, ")");
    }
    suite = LoadTextSuite(options, config);
  }
  const bool task_suite = suite.name == "tiny" || suite.name == "long";
  const TaskFamily family = suite.name == "tiny" ? TaskFamily::kTiny : TaskFamily::kLong;
  suite.selection = {
      {"suite", suite.name},
      {"limit", options.limit},
      {"per_task",
       task_suite ? (options.per_task > 0 ? options.per_task : DefaultPerTask(family)) : 0},
      {"seed", task_suite ? options.seed : 0},
      {"shard", Cat(options.shard_index, "/", options.shard_count)},
      {"prompt_format", PromptFormatName(options.prompt_format)}};
  if (!options.tasks.empty()) suite.selection["tasks"] = options.tasks;
  // Limited runs once kept the first items; a run key from then must not match one from now.
  if (options.limit > 0) suite.selection["limit_takes"] = "every task in turn";
  return suite;
}

}  // namespace polestar::bench
