// `polestar train`: LLaDA SFT of a TinyModel on the task suite. Every step's batch is a
// pure function of (seed, step), so a checkpoint needs only the parameters, the AdamW
// moments and the step to resume exactly.
//
// Objective (LLaDA SFT): the chat prompt is never masked; every answer position (the
// answer tokens, then EOS up to gen_length) is masked with probability t ~ U(eps, 1), one
// t per sequence; loss = mean over sequences of sum over masked positions of
// CE / t / gen_length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/bpe.h"
#include "train/tiny_model.h"

namespace polestar::train {

struct TrainOptions {
  std::string out_dir;
  // Model.
  int layers = 4, width = 128, heads = 4, ffn = 384;
  int bpe_merges = 300;
  // Data.
  // Tasks to draw from, uniformly per sequence; a task named k times is drawn k times as
  // often. Empty: all tasks once.
  std::vector<std::string> tasks;
  int gen_length = 32;
  int batch = 128;
  float mask_eps = 0.1f;  // t ~ U(eps, 1); bounds the 1/t weight at 1/eps
  // Optimiser: AdamW, linear warmup then cosine decay to min_lr_ratio * lr.
  int steps = 1000;
  float lr = 2e-3f, min_lr_ratio = 0.1f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f;
  float adam_eps = 1e-8f, clip = 1.0f;
  int warmup = 100;
  uint64_t seed = 1;
  // Bookkeeping.
  int checkpoint_every = 250;
  int eval_every = 0;  // 0: only at the end
  int eval_items = 20;
  int block_length = 8;
  int log_every = 10;
  int threads = 0;
  bool resume = false;
  // Start afresh in a folder that holds a run: its checkpoint and logs are discarded. Without
  // it (and without resume) Run refuses such a folder rather than overwrite the run.
  bool force = false;
  bool quiet = false;
  // Warm start: parameters and tokenizer from this run folder's checkpoint, or from a model
  // folder (model.safetensors and tokenizer.json, e.g. a bundled model), of the same model
  // shape, with a fresh optimiser and schedule. Empty: random init.
  std::string init_from;

  // The options that define the run; a resume must match them.
  std::string Fingerprint() const;
};

// The task list the options select (all tasks when none are named), with repeats.
std::vector<std::string> SelectedTasks(const TrainOptions& options);
// `tasks` without repeats, in first-seen order.
std::vector<std::string> DistinctTasks(const std::vector<std::string>& tasks);

// Byte-level BPE trained on chat prompts + answers of a fixed sample of the training split.
BpeTokenizer BuildTokenizer(const std::vector<std::string>& tasks, int merges);

TinyConfig MakeTinyConfig(const TrainOptions& options, const BpeTokenizer& tokenizer);

Batch MakeBatch(const BpeTokenizer& tokenizer, const TinyConfig& config,
                const TrainOptions& options, const std::vector<std::string>& tasks, int64_t step);

float LearningRate(const TrainOptions& options, int64_t step);

class Trainer {
 public:
  explicit Trainer(TrainOptions options);  // resumes from out_dir when options.resume

  // One optimiser step; returns the batch loss. Throws Error, before the update, when the
  // loss or the gradient is not finite.
  double Step();
  // Runs to options.steps with logging, checkpoints, evaluation and the final export. A
  // fresh run refuses a folder that holds a run unless options.force; a resumed one keeps
  // loss.csv up to the checkpoint's step. Throws Error, with the last checkpoint kept, when
  // the loss turns non-finite.
  void Run();

  void SaveCheckpoint() const;
  const TinyModel& model() const { return model_; }
  const BpeTokenizer& tokenizer() const { return tokenizer_; }
  int64_t step() const { return step_; }
  std::string CheckpointPath() const;
  std::string ModelDir() const;  // out_dir/model: the exported LLaDA folder

  // Exports the model and tokenizer into ModelDir().
  void ExportModel() const;

 private:
  // Validates the checkpoint in out_dir against the options (tensor sizes, finite values,
  // the optimiser's moments and step) before it takes anything; throws Error naming it.
  void LoadCheckpoint();
  // Takes a run checkpoint's parameters; false (nothing taken) when they are of another size.
  bool LoadParams(const std::string& checkpoint_path);
  void Evaluate(int items);

  TrainOptions options_;
  std::vector<std::string> tasks_;
  BpeTokenizer tokenizer_;
  TinyModel model_;
  std::vector<float> grads_, adam_m_, adam_v_;
  int64_t step_ = 0;
  int64_t last_batch_tokens_ = 0;
  float last_grad_norm_ = 0.0f;
};

}  // namespace polestar::train
