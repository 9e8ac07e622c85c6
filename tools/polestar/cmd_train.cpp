// polestar train: trains polestar-tiny (a small LLaDA) on the task suite with the LLaDA SFT
// objective; see src/train/trainer.h.
#include "commands.h"
#include "train/trainer.h"

namespace polestar::cli {

void AddTrainCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a small LLaDA model on the task suite");
  auto o = std::make_shared<train::TrainOptions>();
  cmd->add_option("--out", o->out_dir, "run folder: checkpoint, logs, exported model/")->required();
  cmd->add_option("--layers", o->layers, "transformer blocks")->capture_default_str();
  cmd->add_option("--width", o->width, "model width C")->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads")->capture_default_str();
  cmd->add_option("--ffn", o->ffn, "SwiGLU inner width")->capture_default_str();
  cmd->add_option("--merges", o->bpe_merges, "BPE merges of the tokenizer")->capture_default_str();
  cmd->add_option("--tasks", o->tasks, "tasks to train on (default: all); a task named k times is drawn k times as often");
  cmd->add_option("--gen-length", o->gen_length, "answer canvas (answer + EOS padding)")->capture_default_str();
  cmd->add_option("--mask-eps", o->mask_eps, "t ~ U(eps, 1)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  cmd->add_option("--steps", o->steps, "optimiser steps")->capture_default_str();
  cmd->add_option("--lr", o->lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "final lr / peak lr (cosine)")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--clip", o->clip, "gradient norm clip")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of init, data and masking")->capture_default_str();
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "steps between checkpoints")->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "steps between evaluations (0: end only)")->capture_default_str();
  cmd->add_option("--eval-items", o->eval_items, "held-out items per task per evaluation")->capture_default_str();
  cmd->add_option("--block-length", o->block_length, "decoding block length in evaluation")->capture_default_str();
  cmd->add_option("--log-every", o->log_every, "steps between progress lines")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads (0: all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_flag("--resume", o->resume, "continue from the checkpoint in --out");
  cmd->add_option("--init-from", o->init_from,
                  "warm start: parameters and tokenizer of another run folder, fresh optimiser");
  cmd->callback([o] {
    train::Trainer trainer(*o);
    trainer.Run();
  });
}

}  // namespace polestar::cli
