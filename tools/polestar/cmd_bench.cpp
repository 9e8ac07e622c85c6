// polestar bench: a grid of policies x settings over a suite -> JSON lines, CSV, Markdown and a
// Pareto plot; with --scale, step timings on a random-weight checkpoint at a real shape.
#include <cstdio>
#include <filesystem>

#include "backend_flags.h"
#include "base/error.h"
#include "base/parallel.h"
#include "bench/bench.h"
#include "bench/scale.h"
#include "commands.h"
#include "decode/policy_registry.h"
#include "decode_flags.h"
#include "suite_flags.h"

namespace polestar::cli {
namespace {

struct BenchArgs {
  SuiteFlags suite;
  std::string out;
  std::string policies = KnownPolicies(",");  // every registered policy
  std::vector<std::string> grids;
  std::vector<std::string> merge;  // shard folders
  std::string protocol = "until-eos", clock = "wall";
  std::string backend;
  DecodeOptions options;
  int threads = 0;
  bool quiet = false, no_plot = false, dry_run = false;
  // --scale
  bool scale = false;
  bench::ScaleOptions scale_options;
  std::string scale_policies = KnownPolicies(",");
  std::string tpf_from;
};

constexpr const char* kGridHelp = R"(
Grid: --grid "key=v1,v2;key2=v3,v4" runs the cartesian product of the axes (the last axis
turning fastest) for every policy of --policies; a "policy=..." axis replaces --policies for
that grid. Keys are decoding flags without dashes (threshold, block-length or block_length,
gen-length, steps, tau-s, clusters, topk, early-commit, polestar-cache, nvfp4, ...). --grid
may be repeated; the grids are concatenated and duplicate points run once. Examples:
  --policies vanilla,polestar --grid "threshold=0.7,0.9;block-length=8,16"
  --grid "policy=polestar;early-commit=true,false" --grid "policy=fast-dllm-dual;threshold=0.5,0.7,0.9"
The other decoding flags set every point's base. Unless given: --gen-length/--block-length follow
the suite (tiny and probe 32/8, long 128/32, others 256/32), --steps equals --gen-length,
and fast-dllm-prefix/dual and elastic-cache use --threshold 0.9. --seed also picks the tiny
and long suites' test items.

Output folder (-o, default bench/out/SUITE): results.jsonl (one line per finished run) and
items.jsonl (one line per decoded item) are appended as work finishes, so an interrupted or
repeated command skips what is done; results.csv, results.md, pareto.svg/.png (accuracy against
TPF and TPS, Pareto front marked; pareto.gp redraws it) and run.json (command, commit, machine)
are rewritten for the command's grid each time.

--batch N decodes N items together (one forward for the next step of each); tokens, NFE and
accuracy are those of --batch 1, and TPS and items/s are over the wall time of the batched run.

Shards: --shard i/n runs the i-th of n slices of the items (one machine each, e.g. a Slurm
array); bench --merge DIR1 DIR2 ... -o OUT joins the shard folders into what the command
without --shard writes: results.jsonl, items.jsonl, the tables and the plot.

--scale: step timings on a random-weight checkpoint (see bench/README.md): full pass, windowed
pass, prefix- and dual-cache steps, Polestar refresh steps at k clusters, k-means and proxy
attention; every policy under a forced commit schedule; tokens/s projected from the TPF each
policy reached on a suite (--tpf-from results.jsonl). Writes scale.json and scale.md.)";

}  // namespace

void AddBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Accuracy-throughput benchmark over a grid of policies and settings");
  auto args = std::make_shared<BenchArgs>();
  AddSuiteFlags(cmd, args->suite);
  cmd->add_option("--policies", args->policies, "comma-separated policies")->capture_default_str();
  cmd->add_option("--grid", args->grids,
                  "grid spec \"key=v1,v2;key2=...\" (repeatable; see below)");
  cmd->add_option("-o,--output", args->out, "output folder (default: bench/out/SUITE)");
  cmd->add_option("--protocol", args->protocol, "token count of the plot: until-eos | non-eos")
      ->capture_default_str();
  cmd->add_option(
         "--clock", args->clock,
         "time TPS and step timings on the wall clock or the process's CPU time (steadier on a "
         "shared machine with -t 1)")
      ->capture_default_str();
  cmd->add_flag("--no-plot", args->no_plot, "skip gnuplot");
  auto* merge = cmd->add_option("--merge", args->merge,
                                "join these shard output folders (bench --shard i/n) into -o");
  cmd->add_flag("--dry-run", args->dry_run, "print the grid's points and exit")->excludes(merge);
  cmd->add_flag("-q,--quiet", args->quiet, "no progress bar");
  cmd->add_option("-t,--threads", args->threads, "CPU threads (0: all)")
      ->check(CLI::Range(0, 1024));
  // --scale
  bench::ScaleOptions& so = args->scale_options;
  cmd->add_flag("--scale", args->scale, "scale benchmark on a random-weight checkpoint")
      ->excludes(merge);
  cmd->add_option("--like", so.like, "--scale: model shape (llada-1b, llada-8b, dream-7b, ...)")
      ->capture_default_str();
  cmd->add_option("--layer-scale", so.layer_scale, "--scale: multiply the shape's layer count")
      ->check(Within(1e-3, 64))
      ->capture_default_str();
  cmd->add_option(
      "--random-model", so.model_dir,
      "--scale: checkpoint folder (written there when absent; default /tmp/polestar-random-LIKE)");
  cmd->add_option("--gguf-type", so.gguf_type,
                  "--scale: run the checkpoint's GGUF conversion of this type (q4_k_m, q8_0, ...)");
  cmd->add_option("--reps", so.reps, "--scale: repetitions per timed step")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  auto* prompt_length =
      cmd->add_option("--prompt-length", so.prompt_length, "--scale: prompt tokens")
          ->check(CLI::Range(1, 1 << 20))
          ->capture_default_str();
  cmd->add_option("--tokens-per-step", so.tokens_per_step,
                  "--scale: the forced commit schedule's tokens per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--scale-blocks", so.blocks, "--scale: blocks decoded per forced run")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--scale-max-steps", so.max_steps,
                  "--scale: steps per forced run at most (0: no limit)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--scale-policies", args->scale_policies,
                  "--scale: policies run with the forced schedule")
      ->capture_default_str();
  cmd->add_option("--tpf-from", args->tpf_from,
                  "--scale: results.jsonl whose TPF (and step mix) to project from");
  auto* like = cmd->get_option("--like");
  cmd->add_option("--prompt-suite", so.prompt_suite,
                  "--scale: prompt length = the mean token length of this suite's prompts "
                  "(gsm8k: 5-shot) under --prompt-tokenizer");
  cmd->add_option("--prompt-tokenizer", so.prompt_tokenizer,
                  "--scale: folder with the tokenizer.json that measures --prompt-suite");
  cmd->add_option("--fit-layers", so.fit_layers,
                  "--scale: time the steps at these two layer counts of the shape and "
                  "extrapolate per layer to its full count")
      ->expected(2);
  cmd->add_flag("--paper", so.paper,
                "--scale: the paper's protocol: --like llada-8b unless given, --prompt-suite "
                "gsm8k unless a --prompt-length is given, gen 256 / block 32, and a projection "
                "at the paper's TPF values");
  AddBackendFlag(cmd, args->backend);
  AddDecodeFlags(cmd, args->options);
  cmd->footer(kGridHelp);
  cmd->callback([args, cmd, like, prompt_length] {
    SetThreadCount(args->threads);
    const bench::MachineInfo machine =
        bench::DescribeMachine(bench::ProcessCommandLine(), bench::SourceDir(), ThreadCount());
    if (!args->merge.empty()) {
      if (args->out.empty()) Fail("--merge needs the output folder: -o DIR");
      bench::MergeRequest request;
      request.shard_dirs = args->merge;
      request.out_dir = args->out;
      request.machine = machine;
      request.protocol = bench::ProtocolFromName(args->protocol);
      request.plot = !args->no_plot;
      const bench::BenchOutcome outcome = bench::MergeShards(request);
      std::printf("%d run(s) merged from %zu folder(s), %d already in %s\n",
                  int(outcome.rows.size()) - outcome.runs_skipped, args->merge.size(),
                  outcome.runs_skipped, args->out.c_str());
      for (const std::string& f : outcome.files) std::printf("  %s\n", f.c_str());
      return;
    }
    if (args->scale) {
      bench::ScaleOptions options = args->scale_options;
      options.policies = bench::SplitList(args->scale_policies, ',', "--scale-policies");
      options.base = args->options;
      if (!GivenDecodeFlags(cmd).count("gen-length")) options.base.gen_length = 256;
      if (!GivenDecodeFlags(cmd).count("block-length")) options.base.block_length = 32;
      options.tpf_from = args->tpf_from;
      if (options.paper) {
        if (like->count() == 0) options.like = "llada-8b";
        // A given prompt length stands for the suite's (where its tokenizer is not at hand).
        if (options.prompt_suite.empty() && prompt_length->count() == 0)
          options.prompt_suite = "gsm8k";
      }
      options.data_dir = args->suite.data_dir;
      options.out_dir = args->out.empty() ? "bench/out/scale" : args->out;
      options.progress = !args->quiet;
      options.clock = bench::ClockFromName(args->clock);
      options.backend = &ChosenBackend(args->backend);
      bench::RunScaleBenchmark(options, machine);
      return;
    }
    std::vector<bench::GridPoint> points =
        bench::ExpandGrids(bench::SplitList(args->policies, ',', "--policies"), args->grids);
    for (bench::GridPoint& p : points) {
      for (auto& [key, value] : p.settings) key = CanonicalDecodeFlag(key);
    }
    const bench::SuiteOptions suite_options = ResolveSuiteFlags(args->suite, args->options.seed);
    const std::string& model_dir = suite_options.model_dir;
    auto model = LoadModelOnBackend(model_dir, args->backend);
    const bench::BenchSuite suite = bench::LoadBenchSuite(suite_options, model->config());

    bench::BenchRequest request;
    request.model_dir = model_dir;
    request.points = points;
    request.base = args->options;
    request.explicit_keys = GivenDecodeFlags(cmd);
    request.setter = SetDecodeOption;
    request.out_dir = args->out.empty()
                          ? (std::filesystem::path("bench") / "out" / suite.name).string()
                          : args->out;
    request.machine = machine;
    request.protocol = bench::ProtocolFromName(args->protocol);
    request.clock = bench::ClockFromName(args->clock);
    request.batch = args->suite.batch;
    request.plot = !args->no_plot;
    request.progress = !args->quiet;
    if (args->dry_run) {
      for (const bench::GridPoint& p : points) {
        const DecodeOptions o =
            bench::ResolvePoint(request.base, request.explicit_keys, p, suite, SetDecodeOption);
        std::printf("%-50s gen %d block %d steps %d threshold %g\n", p.Label().c_str(),
                    o.gen_length, o.block_length, o.steps, o.threshold.value_or(0));
      }
      std::printf("%zu points x %zu items\n", points.size(), suite.items.size());
      return;
    }
    const bench::BenchOutcome outcome = bench::RunBench(*model, suite, request);
    std::printf("%d run(s), %d already done, %d item(s) decoded\n", int(outcome.rows.size()),
                outcome.runs_skipped, outcome.items_decoded);
    for (const std::string& f : outcome.files) std::printf("  %s\n", f.c_str());
  });
}

}  // namespace polestar::cli
