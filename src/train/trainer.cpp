#include "train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>

#include "base/error.h"
#include "base/parallel.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "tasks/tasks.h"
#include "train/eval.h"

namespace polestar::train {
namespace fs = std::filesystem;

std::string TrainOptions::Fingerprint() const {
  nlohmann::ordered_json j = {{"layers", layers},
                              {"width", width},
                              {"heads", heads},
                              {"ffn", ffn},
                              {"bpe_merges", bpe_merges},
                              {"tasks", tasks},
                              {"gen_length", gen_length},
                              {"batch", batch},
                              {"mask_eps", mask_eps},
                              {"stratified_t", true},
                              {"steps", steps},
                              {"lr", lr},
                              {"min_lr_ratio", min_lr_ratio},
                              {"weight_decay", weight_decay},
                              {"beta1", beta1},
                              {"beta2", beta2},
                              {"adam_eps", adam_eps},
                              {"clip", clip},
                              {"warmup", warmup},
                              {"seed", seed},
                              {"init_from", init_from}};
  return j.dump();
}

std::vector<std::string> SelectedTasks(const TrainOptions& options) {
  if (options.tasks.empty()) return TaskNames();
  for (const std::string& task : options.tasks) CheckTaskName(task);
  return options.tasks;
}

std::vector<std::string> DistinctTasks(const std::vector<std::string>& tasks) {
  std::vector<std::string> distinct;
  for (const std::string& task : tasks) {
    if (std::find(distinct.begin(), distinct.end(), task) == distinct.end())
      distinct.push_back(task);
  }
  return distinct;
}

BpeTokenizer BuildTokenizer(const std::vector<std::string>& tasks, int merges) {
  // The corpus is fixed (not the run's seed): the tokenizer belongs to the task suite, so
  // runs with different seeds share it and can warm-start from each other.
  std::vector<std::string> corpus;
  for (const std::string& task : DistinctTasks(tasks)) {
    for (uint64_t i = 0; i < 1000; ++i) {
      const TaskItem item = MakeTaskItem(task, Split::kTrain, i, MixSeed({1, 0x70C}));
      corpus.push_back(ChatPrompt(item.prompt) + item.answer);
    }
  }
  return BpeTokenizer::Train(corpus, merges);
}

TinyConfig MakeTinyConfig(const TrainOptions& options, const BpeTokenizer& tokenizer) {
  TinyConfig c;
  c.vocab = tokenizer.vocab_size();
  c.width = options.width;
  c.layers = options.layers;
  c.heads = options.heads;
  c.ffn = options.ffn;
  c.mask_id = tokenizer.TokenId(kMaskToken);
  c.eos_id = tokenizer.TokenId(kEosToken);
  c.pad_id = c.eos_id;
  return c;
}

Batch MakeBatch(const BpeTokenizer& tokenizer, const TinyConfig& config,
                const TrainOptions& options, const std::vector<std::string>& tasks, int64_t step) {
  Batch batch;
  batch.starts.push_back(0);
  const uint64_t slice_offset = Rng(MixSeed({options.seed, uint64_t(step), 0x5EED})).Next();
  for (int s = 0; s < options.batch; ++s) {
    Rng rng(MixSeed({options.seed, uint64_t(step), uint64_t(s)}));
    const std::string& task = tasks[size_t(rng.Range(0, int(tasks.size()) - 1))];
    const TaskItem item = MakeTaskItem(task, Split::kTrain, rng.Next(), options.seed);
    const std::vector<int> prompt = tokenizer.Encode(ChatPrompt(item.prompt));
    std::vector<int> answer = tokenizer.Encode(item.answer);
    if (int(answer.size()) > options.gen_length) {
      Fail("task ", task, ": answer of ", answer.size(), " tokens exceeds gen length ",
           options.gen_length, ": ", item.answer);
    }
    answer.resize(size_t(options.gen_length), config.eos_id);
    if (int(prompt.size() + answer.size()) > config.max_positions) {
      Fail("task ", task, ": sequence exceeds ", config.max_positions, " positions");
    }
    // Stratified t: sequence s draws from slice (s + offset) mod B of [0, 1), so each t is
    // still U(eps, 1) while a batch covers the range evenly, which tames the variance of
    // the 1/t weights on small batches.
    const uint64_t slice = (slice_offset + uint64_t(s)) % uint64_t(options.batch);
    const double u = (double(slice) + rng.Uniform()) / options.batch;
    const float t = options.mask_eps + (1.0f - options.mask_eps) * float(u);
    const float weight = 1.0f / (t * float(options.gen_length) * float(options.batch));
    for (size_t i = 0; i < prompt.size(); ++i) {
      batch.tokens.push_back(prompt[i]);
      batch.positions.push_back(int(i));
    }
    for (size_t i = 0; i < answer.size(); ++i) {
      const int row = int(batch.tokens.size());
      if (rng.Uniform() < t) {
        batch.tokens.push_back(config.mask_id);
        batch.target_rows.push_back(row);
        batch.targets.push_back(answer[i]);
        batch.weights.push_back(weight);
      } else {
        batch.tokens.push_back(answer[i]);
      }
      batch.positions.push_back(int(prompt.size() + i));
    }
    batch.starts.push_back(int(batch.tokens.size()));
  }
  return batch;
}

float LearningRate(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * float(step + 1) / float(o.warmup);
  const double progress = double(step - o.warmup) / double(std::max(1, o.steps - o.warmup));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, progress)));
  return float(o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine));
}

namespace {

// The folder whose tokenizer a warm start takes: a run folder's exported model when it has a
// checkpoint, else the folder itself (an exported or bundled model).
std::string WarmStartModelDir(const TrainOptions& options) {
  const fs::path from(options.init_from);
  return fs::exists(from / "checkpoint.safetensors") ? (from / "model").string() : from.string();
}

constexpr std::string_view kLossHeader = "step,loss,lr,grad_norm,tokens_per_s,elapsed_s";

// What a run writes into its folder; model/ is the exported model.
constexpr const char* kRunFiles[] = {"checkpoint.safetensors", "checkpoint.json", "loss.csv",
                                     "eval.csv", "model"};

// A fresh run may not mix with, or overwrite, another one: refused unless forced; forced,
// the old run's checkpoint and logs go (model/ is replaced at the first evaluation).
void PrepareFreshRunFolder(const TrainOptions& options) {
  std::string found;
  for (const char* name : kRunFiles) {
    std::error_code error;
    if (fs::exists(fs::symlink_status(fs::path(options.out_dir) / name, error)))
      found += Cat(found.empty() ? "" : ", ", name);
  }
  if (found.empty()) return;
  if (!options.force) {
    Fail(options.out_dir, ": already holds a run (", found,
         "); --resume continues it, --force discards it and starts afresh");
  }
  for (const char* name : {"checkpoint.safetensors", "checkpoint.json", "loss.csv", "eval.csv"}) {
    std::error_code error;
    fs::remove(fs::path(options.out_dir) / name, error);
    if (error) Fail(options.out_dir, "/", name, ": cannot remove: ", error.message());
  }
}

// A loss.csv row: step, then five numbers.
bool IsLossRow(const std::string& line, int64_t* step) {
  const char* const end = line.data() + line.size();
  const auto [after_step, error] = std::from_chars(line.data(), end, *step);
  if (error != std::errc()) return false;
  const char* field = after_step;
  for (int i = 0; i < 5; ++i) {
    if (field == end || *field != ',') return false;
    double value = 0.0;
    const auto [after, number_error] = std::from_chars(field + 1, end, value);
    if (number_error != std::errc()) return false;
    field = after;
  }
  return field == end;
}

// loss.csv's header and rows up to `step` (the checkpoint's): the rows after it are of steps
// the resumed run redoes, and the last of them may be cut short by the interruption.
std::string LossLogUpTo(const std::string& path, int64_t step) {
  std::string kept = Cat(kLossHeader, "\n");
  std::error_code error;
  if (!fs::exists(path, error) && !error) return kept;
  std::ifstream in(path);
  if (!in) Fail(path, ": cannot read");
  std::string line;
  if (std::getline(in, line) && line != kLossHeader) {
    Fail(path, ":1: not the loss log's header (", kLossHeader, "): ", line);
  }
  int64_t previous = 0;
  for (int number = 2; previous < step && std::getline(in, line); ++number) {
    int64_t row_step = 0;
    if (!IsLossRow(line, &row_step) || row_step <= previous) {
      Fail(path, ":", number, ": not a row of ", kLossHeader, " after step ", previous, ": ", line);
    }
    if (row_step > step) break;
    kept += line + "\n";
    previous = row_step;
  }
  return kept;
}

}  // namespace

Trainer::Trainer(TrainOptions options)
    : options_(std::move(options)),
      tasks_(SelectedTasks(options_)),
      // A warm start keeps the source's tokenizer, so token ids mean the same tokens even
      // when the task texts (and so the merges a fresh run would learn) have changed.
      tokenizer_(options_.init_from.empty() ? BuildTokenizer(tasks_, options_.bpe_merges)
                                            : BpeTokenizer::Load(WarmStartModelDir(options_))),
      model_(MakeTinyConfig(options_, tokenizer_)) {
  if (options_.out_dir.empty()) Fail("train: --out is required");
  if (options_.steps <= 0 || options_.batch <= 0) Fail("train: steps and batch must be positive");
  SetThreadCount(options_.threads);
  // Threads split the products in train/layers.cpp; OpenBLAS's own pool would compete.
  openblas_set_num_threads(1);
  std::error_code error;
  fs::create_directories(options_.out_dir, error);
  if (error) Fail(options_.out_dir, ": cannot create the run folder: ", error.message());
  model_.Init(options_.seed);
  if (!options_.init_from.empty()) {
    // A run folder's checkpoint holds its latest parameters; a deeper model grows from the
    // run's exported model instead (TinyModel::Import).
    const fs::path checkpoint = fs::path(options_.init_from) / "checkpoint.safetensors";
    if (!fs::exists(checkpoint) || !LoadParams(checkpoint.string())) {
      model_.Import(WarmStartModelDir(options_));
    }
  }
  grads_.assign(model_.params().size(), 0.0f);
  adam_m_.assign(model_.params().size(), 0.0f);
  adam_v_.assign(model_.params().size(), 0.0f);
  if (options_.resume && fs::exists(CheckpointPath())) LoadCheckpoint();
}

std::string Trainer::CheckpointPath() const {
  return (fs::path(options_.out_dir) / "checkpoint.safetensors").string();
}

std::string Trainer::ModelDir() const { return (fs::path(options_.out_dir) / "model").string(); }

double Trainer::Step() {
  const Batch batch = MakeBatch(tokenizer_, model_.config(), options_, tasks_, step_);
  last_batch_tokens_ = int64_t(batch.tokens.size());
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  const double loss = model_.Run(batch, grads_.data());

  double norm_sq = 0.0;
  for (float g : grads_) norm_sq += double(g) * g;
  const float norm = float(std::sqrt(norm_sq));
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    // Updating would spread the non-finite values into every parameter and the moments.
    Fail("step ", step_ + 1, ": the loss is ", loss, " and the gradient norm ", norm,
         "; training diverged and stops, the last checkpoint (", CheckpointPath(),
         ") is kept as it was");
  }
  last_grad_norm_ = norm;
  const float clip_scale = norm > options_.clip ? options_.clip / norm : 1.0f;
  const float lr = LearningRate(options_, step_);
  const double t = double(step_ + 1);
  const float correct1 = float(1.0 / (1.0 - std::pow(double(options_.beta1), t)));
  const float correct2 = float(1.0 / (1.0 - std::pow(double(options_.beta2), t)));
  std::vector<float>& p = model_.params();
  for (const ParamTensor& tensor : model_.tensors()) {
    const float decay = tensor.decay ? options_.weight_decay : 0.0f;
    ParallelFor(tensor.size(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = tensor.offset + begin; i < tensor.offset + end; ++i) {
        const float g = grads_[size_t(i)] * clip_scale;
        float& m = adam_m_[size_t(i)];
        float& v = adam_v_[size_t(i)];
        m = options_.beta1 * m + (1.0f - options_.beta1) * g;
        v = options_.beta2 * v + (1.0f - options_.beta2) * g * g;
        const float update = (m * correct1) / (std::sqrt(v * correct2) + options_.adam_eps);
        p[size_t(i)] -= lr * (update + decay * p[size_t(i)]);
      }
    });
  }
  ++step_;
  return loss;
}

void Trainer::SaveCheckpoint() const {
  const std::string meta_path = (fs::path(options_.out_dir) / "checkpoint.json").string();
  WriteFileAtomically(meta_path, options_.Fingerprint() + "\n");
  const int64_t n = int64_t(model_.params().size());
  // Atomic: an interrupted save leaves the old checkpoint.
  WriteSafetensors(CheckpointPath(),
                   {F32Tensor("params", {n}, model_.params()), F32Tensor("adam_m", {n}, adam_m_),
                    F32Tensor("adam_v", {n}, adam_v_), I64Tensor("step", {1}, {step_})});
}

bool Trainer::LoadParams(const std::string& path) {
  TensorStore store;
  store.set_origin(path);
  ReadSafetensorsFile(path, store);
  const TensorRef& t = store.Get("params");
  if (t.dtype != DType::kF32) Fail(path, ": its parameters are not F32");
  if (t.bytes != model_.params().size() * 4) return false;
  std::memcpy(model_.params().data(), t.data, t.bytes);
  return true;
}

void Trainer::LoadCheckpoint() {
  const std::string path = CheckpointPath();
  const std::string meta_path = (fs::path(options_.out_dir) / "checkpoint.json").string();
  const nlohmann::json saved = ReadJsonFile(meta_path);
  if (saved.dump() != nlohmann::json::parse(options_.Fingerprint()).dump()) {
    Fail(path, ": the checkpoint was written with other options (", saved.dump(),
         "); resume with the same flags");
  }
  TensorStore store;
  store.set_origin(path);
  ReadSafetensorsFile(path, store);
  // Everything is read into copies and checked before the model or the optimiser takes any.
  const size_t n = model_.params().size();
  auto floats = [&](const char* name) {
    const TensorRef& t = store.Get(name);
    if (t.dtype != DType::kF32 || t.shape != std::vector<int64_t>{int64_t(n)}) {
      Fail(path, ": tensor ", name, " is ", DTypeName(t.dtype), " of ", t.NumElements(),
           " values; the model these options make has ", n, " F32 parameters");
    }
    std::vector<float> values(n);  // [n]
    std::memcpy(values.data(), t.data, n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(values[i])) Fail(path, ": tensor ", name, "[", i, "] is ", values[i]);
    }
    return values;
  };
  std::vector<float> params = floats("params"), adam_m = floats("adam_m"),
                     adam_v = floats("adam_v");
  const TensorRef& step_tensor = store.Get("step");
  if (step_tensor.dtype != DType::kI64 || step_tensor.NumElements() != 1) {
    Fail(path, ": tensor step is not one I64 value");
  }
  int64_t step = 0;
  std::memcpy(&step, step_tensor.data, sizeof(step));
  if (step < 0 || step > options_.steps) {
    Fail(path, ": step ", step, " is outside the run's 0..", options_.steps);
  }
  for (size_t i = 0; i < n; ++i) {
    // The second moment is an average of squares; before any step both moments are zero.
    if (adam_v[i] < 0.0f) Fail(path, ": tensor adam_v[", i, "] is negative (", adam_v[i], ")");
    if (step == 0 && (adam_m[i] != 0.0f || adam_v[i] != 0.0f)) {
      Fail(path, ": the optimiser moments are not zero at step 0 (element ", i, ")");
    }
  }
  model_.params() = std::move(params);
  adam_m_ = std::move(adam_m);
  adam_v_ = std::move(adam_v);
  step_ = step;
}

void Trainer::ExportModel() const {
  model_.Export(ModelDir());
  tokenizer_.WriteFiles(ModelDir(), model_.config().max_positions);
}

void Trainer::Evaluate(int items) {
  ExportModel();
  auto model = Model::Load(ModelDir());
  DecodeOptions decode;  // vanilla: one token per step, blocks left to right
  decode.gen_length = options_.gen_length;
  decode.block_length = options_.block_length;
  decode.steps = options_.gen_length;
  // A decoding step of a model this small is a few hundred microseconds of work; spread
  // over threads it mostly waits on them (badly so on a busy machine), so decode on one.
  const int threads = ThreadCount();
  SetThreadCount(1);
  const auto scores =
      EvaluateTasks(ModelDir(), *model, DistinctTasks(tasks_), items, options_.seed + 1000, decode);
  SetThreadCount(threads);
  const std::string path = (fs::path(options_.out_dir) / "eval.csv").string();
  const bool fresh = !fs::exists(path);
  std::ofstream csv(path, std::ios::app);
  if (fresh) csv << "step,task,correct,total,accuracy\n";
  std::string line = Cat("eval step ", step_, ":");
  int correct = 0, total = 0;
  for (const TaskScore& s : scores) {
    csv << step_ << "," << s.task << "," << s.correct << "," << s.total << "," << s.accuracy()
        << "\n";
    line += Cat(" ", s.task, " ", int(std::lround(100 * s.accuracy())), "%");
    correct += s.correct;
    total += s.total;
  }
  if (!options_.quiet) {
    std::fprintf(stderr, "%s | overall %.1f%%\n", line.c_str(),
                 total ? 100.0 * correct / total : 0.0);
  }
}

void Trainer::Run() {
  const std::string csv_path = (fs::path(options_.out_dir) / "loss.csv").string();
  // Everything is checked before anything is written: the folder of a fresh run, the loss log
  // of a resumed one (kept consistent with the checkpoint: no rows past its step).
  if (!options_.resume) PrepareFreshRunFolder(options_);
  WriteFileAtomically(csv_path,
                      options_.resume ? LossLogUpTo(csv_path, step_) : Cat(kLossHeader, "\n"));
  std::ofstream csv(csv_path, std::ios::app);
  if (!options_.quiet) {
    std::fprintf(stderr, "polestar train: %lld parameters, vocab %d, %zu tasks, step %lld of %d\n",
                 static_cast<long long>(model_.ParameterCount()), model_.config().vocab,
                 DistinctTasks(tasks_).size(), static_cast<long long>(step_), options_.steps);
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int64_t first_step = step_;
  int64_t tokens = 0;
  double loss_sum = 0.0, norm_sum = 0.0;
  int loss_count = 0;
  while (step_ < options_.steps) {
    const float lr = LearningRate(options_, step_);
    const double loss = Step();
    tokens += last_batch_tokens_;
    loss_sum += loss;
    norm_sum += last_grad_norm_;
    ++loss_count;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double tokens_per_s = tokens / std::max(elapsed, 1e-9);
    csv << step_ << "," << loss << "," << lr << "," << last_grad_norm_ << "," << tokens_per_s << ","
        << elapsed << "\n";
    if (!options_.quiet && (step_ % options_.log_every == 0 || step_ == options_.steps)) {
      const double per_step = elapsed / double(step_ - first_step);
      const double eta = per_step * double(options_.steps - step_);
      std::fprintf(stderr,
                   "step %lld/%d  loss %.4f  |g| %.2f  lr %.2e  %.0f tok/s  elapsed %.1f min  "
                   "ETA %.1f min\n",
                   static_cast<long long>(step_), options_.steps, loss_sum / loss_count,
                   norm_sum / loss_count, lr, tokens_per_s, elapsed / 60, eta / 60);
      loss_sum = 0.0;
      norm_sum = 0.0;
      loss_count = 0;
    }
    if (step_ % options_.checkpoint_every == 0 || step_ == options_.steps) {
      csv.flush();
      SaveCheckpoint();
    }
    if (options_.eval_every > 0 && step_ % options_.eval_every == 0 && step_ < options_.steps) {
      Evaluate(options_.eval_items);
    }
  }
  Evaluate(options_.eval_items);
}

}  // namespace polestar::train
