// polestar train: trains polestar-tiny (a small LLaDA) on the task suite with the LLaDA SFT
// objective; see src/train/trainer.h.
#include "commands.h"
#include "decode_flags.h"
#include "train/trainer.h"

namespace polestar::cli {

void AddTrainCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a small LLaDA model on the task suite");
  auto o = std::make_shared<train::TrainOptions>();
  cmd->add_option("--out", o->out_dir, "run folder: checkpoint, logs, exported model/")->required();
  cmd->add_option("--layers", o->layers, "transformer blocks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--width", o->width, "model width C")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--ffn", o->ffn, "SwiGLU inner width")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--merges", o->bpe_merges, "BPE merges of the tokenizer")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option(
      "--tasks", o->tasks,
      "tasks to train on (default: all); a task named k times is drawn k times as often");
  cmd->add_option("--gen-length", o->gen_length, "answer canvas (answer + EOS padding)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--mask-eps", o->mask_eps, "t ~ U(eps, 1)")
      ->check(Within(1e-6, 1))
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per step")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "optimiser steps")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--lr", o->lr, "peak learning rate")->check(Within(0, 10))->capture_default_str();
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "final lr / peak lr (cosine)")
      ->check(Within(0, 1))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "linear warmup steps")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")
      ->check(Within(0, 10))
      ->capture_default_str();
  cmd->add_option("--clip", o->clip, "gradient norm clip")
      ->check(Within(0, 1e6))
      ->capture_default_str();
  AddUint64Option(cmd, "--seed", o->seed, "seed of init, data and masking");
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "steps between checkpoints")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "steps between evaluations (0: end only)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--eval-items", o->eval_items, "held-out items per task per evaluation")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--block-length", o->block_length, "decoding block length in evaluation")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--log-every", o->log_every, "steps between progress lines")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads (0: all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_flag("--resume", o->resume, "continue from the checkpoint in --out");
  cmd->add_flag("--force", o->force,
                "start afresh in an --out that holds a run, discarding its checkpoint and logs "
                "(without it, or --resume, such a folder is refused)");
  cmd->add_option("--init-from", o->init_from,
                  "warm start: parameters and tokenizer of another run folder or of a model "
                  "folder of the same shape (e.g. models/polestar-tiny), fresh optimiser; one "
                  "with fewer --layers grows in depth (new blocks start as the identity)");
  cmd->callback([o] {
    train::Trainer trainer(*o);
    trainer.Run();
  });
}

}  // namespace polestar::cli
