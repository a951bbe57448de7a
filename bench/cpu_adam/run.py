#!/usr/bin/python3
"""CPU Adam on 100M parameters: Tandem's fused kernel against the STREAM triad
bandwidth and torch.optim.Adam, in one run. Targets: >= 70% of triad, >= 5x torch."""
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
adam = next(v for k, v in ours.items() if k[0] == "adam")
peer = next(iter(torch_row.values()))
gb = 1e9
print("STREAM triad           %7.2f GB/s  (%.2f GB/s counting the write-allocate reads of a[])" %
      (triad["bytes_per_second"] / gb, triad["bytes_per_second"] * 16 / 12 / gb))
print("Tandem Adam (%s)  %7.2f GB/s  %8.1f ms/step  %5.1f%% of triad" % (
    adam["impl"].split("-")[1], adam["bytes_per_second"] / gb, 1e3 * adam["seconds"],
    100 * adam["bytes_per_second"] / triad["bytes_per_second"]))
print("torch.optim.Adam       %7.2f GB/s  %8.1f ms/step" % (peer["bytes_per_second"] / gb,
                                                          1e3 * peer["seconds"]))
ratio = peer["seconds"] / adam["seconds"]
print("speedup over torch: %.2fx" % ratio)
share = adam["bytes_per_second"] / triad["bytes_per_second"]
print("targets: >= 70%% of triad (%s), >= 5x torch (%s)" % ("met" if share >= 0.7 else "NOT met",
                                                           "met" if ratio >= 5 else "NOT met"))
