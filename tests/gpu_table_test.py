#!/usr/bin/env python3
"""bench/gpu_table.py on hand-made inputs (tests/data/gpu_table): every step's floor is the
larger of its weight bytes over the copy bandwidth and its FLOPs over the best product rate,
computed here by hand.

Model: 2 layers, width 4, vocab 10, 280 parameters (2 x 4 x 10 in embedding and LM head, so
100 per layer), 1000 bytes; canvas 6 + 4, block 2. Rates: 1000 B/s, 1000 FLOP/s at best.
  full pass (20 rows, logits for all 10): 2*100*20 + 2*4*10*10 + 4*4*10*20 = 8000 FLOPs: 8 s
  dual-cache step (4 rows, the block's 2 logit rows): 800 + 160 + 640 = 1600 FLOPs: 1.6 s,
  above the bytes' 1 s.

A mixture (scale_moe.json): the same shape with 4 experts of width 2 in both layers (3 x 4 x 2
= 24 parameters and 960 bytes each: 192 parameters and 7680 bytes routed), 8 other parameters
a layer, one expert a token; 10000 bytes in all.
  full pass, every expert read (8): 10000 bytes, 10 s; FLOPs 2*8*20 + 2*(20/2)*2*1*24
  + 800 + 3200 = 5280: 5.28 s. Bytes bound it: 10 s.
  dual-cache step, 3 experts read: 10000 - 7680 + 3*960 = 5200 bytes, 5.2 s; FLOPs 64 + 192
  + 160 + 640 = 1056: 1.056 s. Bytes bound it: 5.2 s.
  a step of 400 rows (the block's logits), every expert read: 10 s of bytes; FLOPs 2*8*400
  + 2*(400/2)*2*1*24 + 160 + 4*4*10*400 = 6400 + 19200 + 160 + 64000 = 89760: 89.76 s.
  FLOPs bound it."""
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "data", "gpu_table")
with tempfile.TemporaryDirectory() as out:
    result = os.path.join(out, "table.json")
    table = subprocess.run(
        [sys.executable, os.path.join(here, "..", "bench", "gpu_table.py"),
         "--rates", os.path.join(data, "rates.json"), "--scale", os.path.join(data, "scale.json"),
         "--pytorch", os.path.join(data, "pytorch.json"), "--json", result],
        check=True, capture_output=True, text=True).stdout
    steps = {s["kind"]: s for s in json.load(open(result))["steps"]}

assert set(steps) == {"full pass", "dual-cache step"}, steps  # no rows: no floor
assert abs(steps["full pass"]["floor_s"] - 8.0) < 1e-9, steps
assert steps["full pass"]["bound"] == "FLOPs", steps
assert abs(steps["dual-cache step"]["floor_s"] - 1.6) < 1e-9, steps
assert "| full pass | 20 | 16000.00 | 8000.00 | FLOPs | 2.00 | 32000.00 | 2.00 |" in table, table
assert "| dual-cache step | 4 | 2000.00 | 1600.00 | FLOPs | 1.25 | 1000.00 | 0.50 |" in table, table
# Polestar's runs with their switches, and no other policy's.
assert "| polestar | 4.00 | 20.00 | 3 | 0 |" in table, table
assert "| polestar +nvfp4 +offload | 4.50 | 21.00 | 2 | 1 |" in table, table
assert "| fast-dllm-dual |" not in table.split("system parts")[1], table
print("gpu_table: floors as computed by hand, Polestar's switches")

with tempfile.TemporaryDirectory() as out:
    result = os.path.join(out, "table.json")
    subprocess.run(
        [sys.executable, os.path.join(here, "..", "bench", "gpu_table.py"),
         "--rates", os.path.join(data, "rates.json"),
         "--scale", os.path.join(data, "scale_moe.json"), "--json", result],
        check=True, capture_output=True, text=True)
    steps = {s["kind"]: s for s in json.load(open(result))["steps"]}
assert abs(steps["full pass"]["floor_s"] - 10.0) < 1e-9, steps
assert abs(steps["dual-cache step"]["floor_s"] - 5.2) < 1e-9, steps
assert steps["dual-cache step"]["bound"] == "bytes", steps
assert abs(steps["prefix-cache step"]["floor_s"] - 89.76) < 1e-9, steps
assert steps["prefix-cache step"]["bound"] == "FLOPs", steps
print("gpu_table: a mixture's floors read the experts its steps chose")
