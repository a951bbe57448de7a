#!/usr/bin/python3
"""CPU Adam on 100M parameters: Tandem's fused kernel against the Adam-pattern
loop (Adam's own reads and writes on the same arrays, with trivial arithmetic,
timed interleaved with Adam in the same process), STREAM triad for reference,
and torch.optim.Adam, in one run.
Then Adam in mixed precision (bf16 gradients in, the bf16 working copy out).
Targets: Adam >= 70% of the same-run Adam-pattern loop, >= 5x torch; Adam with
the bf16 copy >= 70% of the same-run triad."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {(r["kernel"], r.get("impl", "")): r for r in map(json.loads, out.splitlines())}


parser = argparse.ArgumentParser()
parser.add_argument("--tandem", required=True)
parser.add_argument("--parameters", type=int, default=100_000_000)
args = parser.parse_args()
flags = ["--parameters=%d" % args.parameters]
ours = rows([args.tandem] + flags)
torch_row = rows([sys.executable, os.path.join(HERE, "torch_adam.py")] + flags)
triad = ours[("triad", "")]
pattern = ours[("adam_pattern", "")]
adam = next(v for k, v in ours.items() if k[0] == "adam")
mixed = next(v for k, v in ours.items() if k[0] == "adam_bf16")
peer = next(iter(torch_row.values()))
gb = 1e9
print("STREAM triad            %7.2f GB/s  %8.1f ms/pass  16 B/element (2 reads, 1 write, "
      "1 write-allocate read); %.2f GB/s at STREAM's 12 B" % (
          triad["bytes_per_second"] / gb, 1e3 * triad["seconds"],
          triad["stream_bytes_per_second"] / gb))
print("Adam-pattern loop       %7.2f GB/s  %8.1f ms/pass  28 B/element (reads p, g, m, v; "
      "writes p, m, v)" % (pattern["bytes_per_second"] / gb, 1e3 * pattern["seconds"]))
share = adam["bytes_per_second"] / pattern["bytes_per_second"]
print("Tandem Adam (%-6s)    %7.2f GB/s  %8.1f ms/step  28 B/element; %5.1f%% of the Adam-pattern "
      "loop, %5.1f%% of triad (16 B)" % (
          adam["impl"].split("-")[1], adam["bytes_per_second"] / gb, 1e3 * adam["seconds"],
          100 * share, 100 * adam["bytes_per_second"] / triad["bytes_per_second"]))
mixed_share = mixed["bytes_per_second"] / triad["bytes_per_second"]
print("Tandem Adam bf16 copy   %7.2f GB/s  %8.1f ms/step  30 B/element (bf16 grads in, bf16 weights "
      "out, fp32 master and state; 28 + the copy's write-allocate); %5.1f%% of triad, pattern loop "
      "beside it %.1f ms" % (mixed["bytes_per_second"] / gb, 1e3 * mixed["seconds"],
                             100 * mixed_share, 1e3 * mixed["pattern_seconds"]))
print("torch.optim.Adam        %7.2f GB/s  %8.1f ms/step  28 B/element" % (
    peer["bytes_per_second"] / gb, 1e3 * peer["seconds"]))
ratio = peer["seconds"] / adam["seconds"]
print("speedup over torch: %.2fx" % ratio)
print("targets: Adam >= 70%% of the same-run Adam-pattern loop (%s), >= 5x torch (%s), Adam with "
      "the bf16 copy >= 70%% of triad (%s)" % (
          "met" if share >= 0.7 else "NOT met", "met" if ratio >= 5 else "NOT met",
          "met" if mixed_share >= 0.7 else "NOT met"))
