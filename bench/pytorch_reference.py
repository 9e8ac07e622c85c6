#!/usr/bin/env python3
"""Times the authors' PyTorch code on a checkpoint written by `polestar make-random-model`.

NVlabs/Fast-dLLM's LLaDA (a full pass, a prefix-cache step, a dual-cache step, and its three
`generate*` functions end to end) and, with --polestar, gt-synergy-lab/Polestar's
`generate_with_dual_cache`, on the same random weights the engine is timed on, so that the two
can be compared on one GPU. It runs only on the GPU machine (never in CI; this is not part of the
product) and prints one JSON object on stdout, progress on stderr. --dry-run needs no torch: it
checks the checkpoint and the reference folders and prints the plan. See bench/README.md.
"""

import argparse
import ast
import dataclasses
import functools
import importlib
import json
import os
import platform
import statistics
import struct
import sys
import time
import traceback
import types
from pathlib import Path

# Both reference models wrap scaled_dot_product_attention in @torch.compile(); unless the caller
# chose otherwise, run it eagerly: compiling costs seconds per new shape and the cached decoders
# change shape every block. Dynamo reads this when torch first imports it, so set it before that.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

# Tokens per forward of LLaDA-8B-Instruct on GSM8K at length 256 in the Polestar paper's Table 1.
PAPER_TPF_FAST_DLLM = 2.72
PAPER_TPF_POLESTAR = 3.67
POLESTAR_THRESHOLD = 0.9  # the authors' configs/llada8b.json

# The files each reference repository must provide, relative to its root (bench/pack_reference.sh
# copies exactly these).
REFERENCE_FILES = {
    "fast-dllm": [
        "llada/generate.py",
        "llada/model/__init__.py",
        "llada/model/configuration_llada.py",
        "llada/model/modeling_llada.py",
    ],
    "polestar": [
        "src/polestar/models/llada/__init__.py",
        "src/polestar/models/llada/clustering.py",
        "src/polestar/models/llada/configuration_llada.py",
        "src/polestar/models/llada/generation.py",
        "src/polestar/models/llada/modeling_llada.py",
    ],
}
# Functions and the parameters this script (or the generate functions it calls) relies on.
GENERATE_PARAMS = {"steps", "gen_length", "block_length", "temperature", "remasking", "mask_id"}
REQUIRED_DEFS = {
    "fast-dllm": {
        ("llada/generate.py", "generate"): GENERATE_PARAMS,
        ("llada/generate.py", "generate_with_prefix_cache"): GENERATE_PARAMS,
        ("llada/generate.py", "generate_with_dual_cache"): GENERATE_PARAMS,
        ("llada/model/modeling_llada.py", "LLaDAModel.forward"): {
            "input_ids", "past_key_values", "use_cache", "replace_position"},
    },
    "polestar": {
        ("src/polestar/models/llada/generation.py", "generate_with_dual_cache"):
            GENERATE_PARAMS | {"threshold", "factor", "threshold_early", "use_cluster"},
        ("src/polestar/models/llada/modeling_llada.py", "LLaDAModel.forward"): {
            "input_ids", "past_key_values", "past_hidden_states", "clustered_hidden_states",
            "use_cache", "replace_position", "cluster", "topk", "efficient",
            "get_token_drift_score", "use_cluster"},
    },
}
MODEL_CONFIG_FILE = {
    "fast-dllm": "llada/model/configuration_llada.py",
    "polestar": "src/polestar/models/llada/configuration_llada.py",
}
# The folder each repository's code is imported from: Fast-dLLM's generate.py imports its model as
# the top-level package `model`; Polestar's llada package is imported alone (as `llada`), without
# the `polestar` package around it, whose __init__ pulls in the evaluation and vision code.
IMPORT_ROOT = {"fast-dllm": "llada", "polestar": "src/polestar/models"}


class SetupError(Exception):
    """A checkpoint or reference folder that cannot be used; the message says why."""


START = time.monotonic()


def log(message):
    print(f"[{time.monotonic() - START:7.1f} s] {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, help="folder from `polestar make-random-model`")
    p.add_argument("--fast-dllm", type=Path, help="NVlabs/Fast-dLLM checkout (or its packed files)")
    p.add_argument("--polestar", type=Path, help="gt-synergy-lab/Polestar checkout (optional)")
    p.add_argument("--prompt-length", type=int, default=900)
    p.add_argument("--gen", type=int, default=256, help="generated tokens")
    p.add_argument("--block", type=int, default=32, help="block length")
    p.add_argument("--reps", type=int, default=3,
                   help="timed repetitions of each step (median) and of each generate (fastest)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions before each step")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompt and every generate")
    p.add_argument("--fdl-tpf", type=float, default=PAPER_TPF_FAST_DLLM,
                   help="Fast-dLLM's cached decoders take steps = blocks x round(block / TPF)")
    p.add_argument("--polestar-tpf", type=float, default=PAPER_TPF_POLESTAR,
                   help="Polestar commits round(TPF) tokens a step through its factor rule")
    p.add_argument("--skip-vanilla", action="store_true",
                   help="skip Fast-dLLM's `generate` (one full pass per token)")
    p.add_argument("--device", default="cuda",
                   help="cuda (the point of the script); cpu only smoke-tests it on a tiny model")
    p.add_argument("--dry-run", action="store_true",
                   help="check the checkpoint and the reference folders, print the plan (no torch)")
    p.add_argument("--list-files", choices=sorted(REFERENCE_FILES),
                   help="print the files needed from that repository and exit")
    args = p.parse_args(argv)
    if args.list_files:
        return args
    if args.checkpoint is None or args.fast_dllm is None:
        p.error("--checkpoint and --fast-dllm are required")
    for name in ("prompt_length", "gen", "block", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    if args.gen % args.block:
        p.error(f"--gen {args.gen} is not a multiple of --block {args.block}")
    for name in ("fdl_tpf", "polestar_tpf"):
        if not 1 <= getattr(args, name) <= args.block:
            p.error(f"--{name.replace('_', '-')} must lie in [1, --block]")
    return args


# ---- The checkpoint, read without torch -----------------------------------------------------

def safetensors_header(path):
    """The JSON header of a .safetensors file: {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SetupError(f"{path}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        text = f.read(length)
    if len(text) != length:
        raise SetupError(f"{path}: header of {length} bytes is cut short")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise SetupError(f"{path}: header is not JSON ({e})") from e
    header.pop("__metadata__", None)
    return header


def read_checkpoint(folder):
    """config.json and the safetensors files of a checkpoint folder, with facts about them."""
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except OSError as e:
        raise SetupError(f"{config_path}: {e.strerror}") from e
    except ValueError as e:
        raise SetupError(f"{config_path}: not JSON ({e})") from e
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        weight_map = json.loads(index_path.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SetupError(f"{index_path}: no weight_map")
        files = sorted({folder / name for name in weight_map.values()})
    elif (folder / "model.safetensors").exists():
        weight_map, files = None, [folder / "model.safetensors"]
    else:
        raise SetupError(f"{folder}: neither model.safetensors nor model.safetensors.index.json")
    names, dtypes = set(), set()
    for path in files:
        if not path.exists():
            raise SetupError(f"{path}: named by {index_path.name} but missing")
        header = safetensors_header(path)
        for name, info in header.items():
            if weight_map is not None and weight_map.get(name) != path.name:
                raise SetupError(f"{path}: holds {name}, which {index_path.name} puts elsewhere")
            names.add(name)
            dtypes.add(info["dtype"])
    if weight_map is not None and set(weight_map) != names:
        missing = sorted(set(weight_map) - names)[:3]
        raise SetupError(f"{index_path}: tensors missing from the shards, e.g. {missing}")
    unprefixed = sorted(n for n in names if not n.startswith("model."))
    if unprefixed:
        raise SetupError(f"{folder}: names without the 'model.' prefix, e.g. {unprefixed[:3]}")
    mask_id = config.get("mask_token_id")
    if not isinstance(mask_id, int) or mask_id < 1:
        raise SetupError(f"{config_path}: mask_token_id is {mask_id!r}, not a positive integer")
    return {
        "config": config,
        "files": files,
        "facts": {
            "path": str(folder),
            "n_layers": config.get("n_layers"),
            "d_model": config.get("d_model"),
            "vocab_size": config.get("vocab_size"),
            "mask_token_id": mask_id,
            "files": len(files),
            "tensors": len(names),
            "bytes": sum(p.stat().st_size for p in files),
            "dtypes": sorted(dtypes),
        },
    }


def split_config(config, field_names):
    """The config.json keys ModelConfig takes, and the ones it does not (model_type, bos/eot ids,
    polestar_random_weights, ...), which are left out."""
    kept = {k: v for k, v in config.items() if k in field_names}
    return kept, sorted(set(config) - set(kept))


# ---- The reference code, read without importing it ------------------------------------------

def parse_source(root, relative):
    path = root / relative
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except OSError as e:
        raise SetupError(f"{path}: {e.strerror}") from e
    except SyntaxError as e:
        raise SetupError(f"{path}: does not parse ({e.msg}, line {e.lineno})") from e


def find_def(tree, dotted):
    """The ast node of a top-level function or class (or a class's method, 'Class.method')."""
    nodes = tree.body
    for part in dotted.split("."):
        found = [n for n in nodes
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part]
        if not found:
            return None
        nodes = found[-1].body
    return found[-1]


def dataclass_fields(tree, class_name):
    """The annotated attributes of a class: the fields of a dataclass."""
    node = find_def(tree, class_name)
    return {n.target.id for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def check_reference(name, root):
    """Checks that a reference folder holds every file, function and parameter used here;
    returns ModelConfig's field names as its source declares them."""
    if not root.is_dir():
        raise SetupError(f"{root}: not a folder")
    trees = {rel: parse_source(root, rel) for rel in REFERENCE_FILES[name]}
    for (rel, dotted), needed in REQUIRED_DEFS[name].items():
        node = find_def(trees[rel], dotted)
        if not isinstance(node, ast.FunctionDef):
            raise SetupError(f"{root / rel}: no function {dotted}")
        params = {a.arg for a in node.args.args + node.args.kwonlyargs}
        if needed - params:
            raise SetupError(f"{root / rel}: {dotted} lacks {sorted(needed - params)}")
    fields = dataclass_fields(trees[MODEL_CONFIG_FILE[name]], "ModelConfig")
    if not fields:
        raise SetupError(f"{root / MODEL_CONFIG_FILE[name]}: no ModelConfig dataclass")
    return fields


def source_commit(root):
    """The 'owner/repo commit' line bench/pack_reference.sh leaves beside the files, if any."""
    path = root / "COMMIT"
    return path.read_text().strip() if path.exists() else None


# ---- What will run ----------------------------------------------------------------------------

def middle_blocks(num_blocks):
    """Blocks whose prefix-cache step costs the mean over all blocks (rows fall linearly)."""
    return [num_blocks // 2 - 1, num_blocks // 2] if num_blocks % 2 == 0 else [num_blocks // 2]


def factor_for(tokens_per_step):
    """Fast-dLLM's factor rule (Polestar's get_transfer_index_dynamic) accepts the n-th most
    confident token while its confidence is at least 1 - f / (n + 1). A random model's
    confidences are about 1 / vocabulary, so f = k + 1 accepts exactly k tokens a step."""
    return tokens_per_step + 1


def make_plan(args, mask_id):
    num_blocks = args.gen // args.block
    common = {"gen_length": args.gen, "block_length": args.block, "temperature": 0.0,
              "remasking": "low_confidence", "mask_id": mask_id}
    # This Fast-dLLM's generate functions take no factor; their fixed-count rule commits
    # block / (steps per block) tokens a step, which sets the tokens per forward on any model.
    fdl_steps = num_blocks * max(1, round(args.block / args.fdl_tpf))
    polestar_tokens = round(args.polestar_tpf)
    policies = {
        "vanilla": ("fast-dllm", "generate", {"steps": args.gen, **common}),
        "prefix": ("fast-dllm", "generate_with_prefix_cache", {"steps": fdl_steps, **common}),
        "dual": ("fast-dllm", "generate_with_dual_cache", {"steps": fdl_steps, **common}),
        # Threshold 0.9 as the authors run it; here it only gates Polestar's suffix commits (no
        # random-model token reaches it). The factor sets the in-block commits. threshold_early
        # must stay None with a factor: the early-commit branch reads confidences that only the
        # threshold path computes.
        "polestar": ("polestar", "generate_with_dual_cache", {
            "steps": args.gen, **common, "threshold": POLESTAR_THRESHOLD,
            "factor": factor_for(polestar_tokens), "threshold_early": None, "use_cluster": True}),
    }
    if args.skip_vanilla:
        del policies["vanilla"]
    if args.polestar is None:
        del policies["polestar"]
    return {
        "canvas_rows": args.prompt_length + args.gen,
        "blocks": num_blocks,
        "prefix_step_blocks": middle_blocks(num_blocks),
        "dual_step_block": middle_blocks(num_blocks)[0],
        "generate": {name: {"code": code, "function": fn, "args": kwargs}
                     for name, (code, fn, kwargs) in policies.items()},
    }


def new_report(args, checkpoint):
    return {
        "device": None,
        "torch": None,
        "transformers": None,
        "python": platform.python_version(),
        "dynamo_disabled": os.environ["TORCHDYNAMO_DISABLE"] == "1",
        "checkpoint": checkpoint["facts"],
        "references": {},
        "prompt_length": args.prompt_length,
        "gen": args.gen,
        "block": args.block,
        "seed": args.seed,
        "reps": args.reps,
        "target_tpf": {"fast-dllm": args.fdl_tpf, "polestar": args.polestar_tpf},
        "steps": {},
        "generate": {},
        "errors": {},
    }


# ---- The run -----------------------------------------------------------------------------------
# torch is imported in run(), so that --dry-run and --list-files work without it; the helpers
# below take the module as an argument.

def record_error(report, part, error):
    report["errors"][part] = f"{type(error).__name__}: {error}"
    log(f"{part} failed:\n{traceback.format_exc()}")


def import_reference(name, root):
    """Imports a reference repository's LLaDA code: (modeling, configuration, generation)."""
    import transformers

    # Both configuration_llada.py and modeling_llada.py register their classes with the Auto
    # factories at import; transformers 5 may refuse (its own "llada" type, dataclass configs),
    # and nothing here goes through the factories, so registration becomes a no-op.
    transformers.AutoConfig.register = lambda *a, **k: None
    transformers.AutoModel.register = lambda *a, **k: None
    sys.path.insert(0, str(root / IMPORT_ROOT[name]))
    package, generation = {"fast-dllm": ("model", "generate"),
                           "polestar": ("llada", "llada.generation")}[name]
    return (importlib.import_module(f"{package}.modeling_llada"),
            importlib.import_module(f"{package}.configuration_llada"),
            importlib.import_module(generation))


def build_model(torch, modeling, configuration, config, state, device):
    """LLaDAModel with the checkpoint's weights, in BF16, in eval mode.

    Built directly rather than through LLaDAModelLM.from_pretrained, which transformers 5 breaks
    (ML-GSAI/LLaDA#130, huggingface/transformers#48253): the parameters are made on the meta
    device (no memory, no random init), given storage on `device` and filled from `state`,
    strictly (every name must match)."""
    fields = {f.name for f in dataclasses.fields(configuration.ModelConfig)}
    model_config = configuration.ModelConfig(**split_config(config, fields)[0])
    model_config.init_device = "meta"
    model = modeling.LLaDAModel(model_config, init_params=False)
    model = model.to(torch.bfloat16).to_empty(device=device)
    model.load_state_dict(state, strict=True)
    return model.eval()


class Adapter:
    """What the generate functions ask of their model: `.device`, and a call returning an object
    with `.logits` and `.past_key_values` (plus Polestar's extra outputs). LLaDAModel returns a
    LLaDAOutput named tuple whose cache is called attn_key_values; LLaDAModelLM, which renames it,
    is the wrapper bypassed above."""

    def __init__(self, model):
        self.model = model
        self.device = model.device

    def __call__(self, input_ids, **kwargs):
        out = self.model(input_ids, **kwargs)._asdict()
        out["past_key_values"] = out.pop("attn_key_values")
        return types.SimpleNamespace(**out)


def make_timer(torch, device):
    """timer(fn) -> (fn's result, milliseconds), by CUDA events on the GPU."""
    if device.type != "cuda":
        def wall(fn):
            t0 = time.perf_counter()
            result = fn()
            return result, (time.perf_counter() - t0) * 1e3
        return wall

    def events(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize()
        return result, start.elapsed_time(end)
    return events


def time_steps(torch, model, canvas, args, plan, timer):
    """Forward passes only (no sampling), as generate.py issues them, median of --reps."""
    def median_ms(fn):
        for _ in range(args.warmup):
            fn()
        return statistics.median(timer(fn)[1] for _ in range(args.reps))

    steps = {"full_pass_ms": median_ms(lambda: model(canvas)), "full_pass_rows": canvas.shape[1]}

    # generate_with_prefix_cache: a full pass keeps the keys and values before the block; each
    # step then runs the block and everything after it.
    prefix_ms, prefix_rows = [], []
    for block in plan["prefix_step_blocks"]:
        start = args.prompt_length + block * args.block
        cache = model(canvas, use_cache=True).attn_key_values
        prefix = [tuple(t[:, :, :start] for t in layer) for layer in cache]
        prefix_ms.append(median_ms(
            lambda: model(canvas[:, start:], past_key_values=prefix, use_cache=True)))
        prefix_rows.append(canvas.shape[1] - start)
    steps["prefix_step_ms"] = statistics.mean(prefix_ms)
    steps["prefix_step_rows"] = statistics.mean(prefix_rows)

    # generate_with_dual_cache: the cache holds every row; each step runs the block alone and
    # writes its keys and values into the cache in place (replace_position).
    start = args.prompt_length + plan["dual_step_block"] * args.block
    end = start + args.block
    cache = model(canvas, use_cache=True).attn_key_values
    replace = torch.zeros_like(canvas, dtype=torch.bool)
    replace[:, start:end] = True
    steps["dual_step_ms"] = median_ms(lambda: model(
        canvas[:, start:end], past_key_values=cache, use_cache=True, replace_position=replace))
    steps["dual_step_rows"] = args.block
    return steps


def run_generate(torch, generate_fn, model, prompt, kwargs, args, timer, before_each=None):
    """--reps timed runs of one generate function; the fastest gives seconds and tokens/s (the
    first run may carry one-time costs)."""
    seconds = []
    for _ in range(args.reps):
        if before_each:
            before_each()
        torch.manual_seed(args.seed)  # Polestar's k-means draws random first centroids
        result, ms = timer(lambda: generate_fn(model, prompt, **kwargs))
        seconds.append(ms / 1e3)
    canvas, nfe = result[0], int(result[1])
    generated = canvas[:, prompt.shape[1]:]
    best = min(seconds)
    summary = {"seconds": best, "seconds_runs": seconds, "nfe": nfe, "tokens": args.gen,
               "tpf": args.gen / nfe, "tokens_per_s": args.gen / best,
               "masks_left": int((generated == kwargs["mask_id"]).sum())}
    if len(result) == 4:  # Polestar: (canvas, nfe, block_stats, prompt length)
        summary["block_stats_totals"] = {
            key: sum(stats[key] for stats in result[2])
            for key in result[2][0] if key not in ("block_id", "block_start", "block_end")}
    return summary


def reset_polestar_state(model):
    """Polestar's blocks keep the last step's attention between calls (for the drift scores);
    clear it so every run starts as on a freshly loaded model."""
    for block in model.transformer.blocks:
        block.attn_weights = None
        block._prev_attn_scores = None


def run(args, checkpoint, plan, report):
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SetupError("torch sees no CUDA device")
    import transformers

    report["torch"] = torch.__version__
    report["transformers"] = transformers.__version__
    report["device"] = (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine())
    timer = make_timer(torch, device)
    config = checkpoint["config"]

    # One copy of the weights on the device, stripped of the "model." that LLaDAModelLM adds.
    from safetensors.torch import load_file
    t0 = time.perf_counter()
    state = {}
    for path in checkpoint["files"]:
        log(f"loading {path.name}")
        for name, tensor in load_file(str(path), device=str(device)).items():
            state[name.removeprefix("model.")] = tensor.to(torch.bfloat16)

    log("building Fast-dLLM's LLaDAModel")
    modeling, configuration, fdl_generate = import_reference("fast-dllm", args.fast_dllm)
    fdl_model = build_model(torch, modeling, configuration, config, state, device)
    polestar = None
    if "polestar" in plan["generate"]:
        try:
            log("building Polestar's LLaDAModel")
            p_modeling, p_configuration, p_generation = import_reference("polestar", args.polestar)
            polestar = (build_model(torch, p_modeling, p_configuration, config, state, device),
                        p_generation)
        except Exception as e:  # the authors' code may not run under transformers 5
            record_error(report, "polestar", e)
    del state
    report["load_seconds"] = time.perf_counter() - t0

    with torch.inference_mode():
        # Prompt ids below the mask id, then the masked canvas every generate starts from.
        generator = torch.Generator().manual_seed(args.seed)
        mask_id = config["mask_token_id"]
        prompt = torch.randint(0, mask_id, (1, args.prompt_length), generator=generator).to(device)
        masks = torch.full((1, args.gen), mask_id, dtype=torch.long, device=device)
        canvas = torch.cat([prompt, masks], dim=1)

        try:
            log("timing steps")
            report["steps"] = time_steps(torch, fdl_model, canvas, args, plan, timer)
        except Exception as e:
            record_error(report, "steps", e)

        for name, entry in plan["generate"].items():
            if name == "polestar" and polestar is None:
                continue
            try:
                log(f"timing {name}: {entry['function']}")
                if name == "polestar":
                    model, module = polestar
                    before = functools.partial(reset_polestar_state, model)
                else:
                    model, module, before = fdl_model, fdl_generate, None
                summary = run_generate(torch, getattr(module, entry["function"]), Adapter(model),
                                       prompt, entry["args"], args, timer, before)
                report["generate"][name] = {**entry, **summary}
            except Exception as e:
                record_error(report, name, e)
            if device.type == "cuda":
                torch.cuda.empty_cache()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list_files:
        print("\n".join(REFERENCE_FILES[args.list_files]))
        return 0
    try:
        checkpoint = read_checkpoint(args.checkpoint)
        fields = check_reference("fast-dllm", args.fast_dllm)
    except SetupError as e:
        print(f"pytorch_reference: {e}", file=sys.stderr)
        return 2
    report = new_report(args, checkpoint)
    report["references"]["fast-dllm"] = {"path": str(args.fast_dllm),
                                         "commit": source_commit(args.fast_dllm)}
    report["config_ignored_keys"] = split_config(checkpoint["config"], fields)[1]
    if args.polestar is not None:
        report["references"]["polestar"] = {"path": str(args.polestar),
                                            "commit": source_commit(args.polestar)}
        try:
            check_reference("polestar", args.polestar)
        except SetupError as e:  # the rest still runs
            report["errors"]["polestar"] = str(e)
            args.polestar = None
    plan = make_plan(args, checkpoint["facts"]["mask_token_id"])

    if args.dry_run:
        report["plan"] = plan
        print(json.dumps(report, indent=2))
        return 0

    status = 0
    try:
        run(args, checkpoint, plan, report)
    except Exception as e:  # loading failed: nothing was timed
        record_error(report, "setup", e)
        status = 1
    print(json.dumps(report, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
