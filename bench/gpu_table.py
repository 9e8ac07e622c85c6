#!/usr/bin/env python3
"""The GPU speed table of bench/RESULTS.md from one scripts/gpu-check.sh run.

Every step time of `polestar bench --scale` (scale.json) stands beside its floor on the same
card: the larger of its weight bytes over the measured device copy bandwidth and its matrix
FLOPs over the measured cuBLAS BF16 rate (rates.json, from gpu_rates), with the authors'
PyTorch times of the same steps (pytorch.json, from bench/pytorch_reference.py) beside ours.

    bench/gpu_table.py --rates R/rates.json --scale R/scale/scale.json \
        [--pytorch R/pytorch.json] [--json OUT]

Floors (stated, not measured):
  weight bytes  = the checkpoint's bytes (every step reads every layer's matrices once); of a
                  mixture's routed experts only those its rows chose, once a layer each
                  (scale.json's experts_read, counted in an untimed run of the same step);
  FLOPs         = 2 x (parameters per layer a row goes through: of a mixture's experts, the
                  experts_per_token it chose) x (rows through the layers)
                  + 2 x width x vocab x (logit rows: the block's, 32, or every row of a full
                  pass) + 4 x width x canvas x (rows through the layers) for attention.
"""
import argparse
import json
import sys

# The step kinds of `bench --scale` that the authors' generate.py has too.
PYTORCH_STEPS = {"full pass": "full_pass_ms", "prefix-cache step": "prefix_step_ms",
                 "dual-cache step": "dual_step_ms"}


def load(path):
    with open(path) as f:
        return json.load(f)


def copy_bandwidth(rates):
    """Bytes per second a device-to-device copy moves (read plus written)."""
    for c in rates["copies"]:
        if c["what"] == "device to device":
            return c["GBps"] * 1e9
    sys.exit("rates.json has no device-to-device copy")


def peak_bf16(rates):
    """The best BF16 product rate measured, FLOP per second."""
    return max(p["tflops"] for p in rates["products"]) * 1e12


def step_floor(step, model, canvas, bandwidth, peak):
    """(seconds, what bounds it) for one step of scale.json."""
    layers = model["layers"]
    width, vocab = model["width"], model["vocab"]
    rows = step["rows_computed"]
    weight_bytes = model["file_bytes"]
    routed_flops = 0  # a mixture's experts: each row through experts_per_token of them
    routed_parameters = 0
    if model.get("experts", 0) > 0 and "experts_read" in step:
        weight_bytes += step["experts_read"] * model["expert_bytes"] - model["routed_expert_bytes"]
        expert_parameters = 3 * width * model["expert_ffn"]
        mixture_layers = model["routed_expert_bytes"] / model["expert_bytes"] / model["experts"]
        routed_parameters = mixture_layers * model["experts"] * expert_parameters
        routed_flops = (2 * rows / layers * mixture_layers * model["experts_per_token"]
                        * expert_parameters)
    per_layer = (model["parameters"] - 2 * width * vocab - routed_parameters) / layers
    length = canvas["prompt"] + canvas["gen_length"]
    logit_rows = length if step["kind"] == "full pass" else canvas["block_length"]
    flops = (2 * per_layer * rows + routed_flops + 2 * width * vocab * logit_rows
             + 4 * width * length * rows)
    byte_seconds = weight_bytes / bandwidth
    flop_seconds = flops / peak
    if byte_seconds >= flop_seconds:
        return byte_seconds, "bytes"
    return flop_seconds, "FLOPs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", required=True)
    parser.add_argument("--scale", required=True)
    parser.add_argument("--pytorch")
    parser.add_argument("--json")
    args = parser.parse_args()
    rates, scale = load(args.rates), load(args.scale)
    pytorch = load(args.pytorch) if args.pytorch else {}
    bandwidth, peak = copy_bandwidth(rates), peak_bf16(rates)
    model, canvas = scale["model"], scale["canvas"]

    print(f"{rates['device']}: device copy {bandwidth / 1e9:.0f} GB/s, "
          f"BF16 products up to {peak / 1e12:.0f} TFLOP/s (gpu_rates)\n")
    print(f"Model: {model['like']} shape, {model['layers']} layers, "
          f"{model['parameters'] / 1e9:.2f} B parameters, {model['file_bytes'] / 1e9:.2f} GB; "
          f"canvas {canvas['prompt']} + {canvas['gen_length']}, block {canvas['block_length']}; "
          f"backend {model['backend']}\n")
    print("| step | rows through the layers | ours, ms | floor, ms | bound by | ours / floor "
          "| PyTorch, ms | PyTorch / ours |")
    print("|---|--:|--:|--:|---|--:|--:|--:|")
    rows_out = []
    for step in scale["steps"]:
        if step["rows_computed"] == 0:  # Polestar's auxiliary work, no rows through the layers
            continue
        ours = step["median_seconds"]
        floor, bound = step_floor(step, model, canvas, bandwidth, peak)
        theirs_ms = pytorch.get("steps", {}).get(PYTORCH_STEPS.get(step["kind"], ""))
        theirs = f"{theirs_ms:.2f}" if theirs_ms else ""
        ratio = f"{theirs_ms / (ours * 1e3):.2f}" if theirs_ms else ""
        print(f"| {step['kind']} | {step['rows_computed']} | {ours * 1e3:.2f} | "
              f"{floor * 1e3:.2f} | {bound} | {ours / floor:.2f} | {theirs} | {ratio} |")
        rows_out.append({"kind": step["kind"], "ours_s": ours, "floor_s": floor, "bound": bound,
                         "pytorch_ms": theirs_ms})

    if scale.get("paper_projection"):
        print("\nTokens per second at the paper's TPF values (GSM8K 5-shot, gen 256):\n")
        print("| policy | paper TPF | ours, TPS | paper A100, TPS | ours / paper | PyTorch, TPS |")
        print("|---|--:|--:|--:|--:|--:|")
        generate = pytorch.get("generate", {})
        theirs_by_policy = {"vanilla": "vanilla", "fast-dllm-dual": "dual", "polestar": "polestar"}
        for p in scale["paper_projection"]:
            theirs = generate.get(theirs_by_policy.get(p["policy"], ""), {})
            tps = theirs.get("tokens_per_second")
            print(f"| {p['policy']} | {p['paper_tpf']:.2f} | {p['tps_all_positions']:.1f} | "
                  f"{p['paper_tps']:.2f} | {p['tps_all_positions'] / p['paper_tps']:.2f} | "
                  f"{f'{tps:.1f}' if tps else ''} |")
    switches = [r for r in scale.get("forced", [])
                if r["policy"].startswith("polestar") and "error" not in r]
    if switches:
        print("\nPolestar's system parts, each switched on (forced schedule; backend memory the "
              "most held during the run):\n")
        print("| run | step ms | block start ms | GPU MB | offloaded MB |")
        print("|---|--:|--:|--:|--:|")
        megabytes = lambda b: f"{b / 2**20:.0f}" if b is not None and b >= 0 else "-"
        for r in switches:
            print(f"| {r['policy']} | {r['step_seconds'] * 1e3:.2f} | "
                  f"{r['block_start_seconds'] * 1e3:.2f} | "
                  f"{megabytes(r.get('backend_peak_bytes'))} | "
                  f"{megabytes(r.get('offloaded_peak_bytes'))} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_Bps": bandwidth, "peak_flops": peak, "steps": rows_out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
