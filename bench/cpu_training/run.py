#!/usr/bin/python3
"""Tandem's CPU engine against PyTorch on the same models, in one run.

Runs bench/cpu_training/train_throughput (Tandem) and torch_peer.py (PyTorch),
alternating, for --rounds rounds, and prints each side's median samples/s and
the ratio. Both use 2 threads and the same batch sizes. Usage:
  /usr/bin/python3 bench/cpu_training/run.py --tandem bazel-bin/bench/cpu_training/train_throughput
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from machine import cpu_model  # noqa: E402


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    common = ["--models=" + args.models, "--threads=%d" % args.threads,
              "--seconds=%g" % args.seconds]
    results = {}
    for r in range(args.rounds):
        for impl, cmd in (("tandem", [args.tandem] + common),
                          ("pytorch", [sys.executable, os.path.join(HERE, "torch_peer.py")] + common)):
            for row in run_json(cmd):
                if "machine" in row:
                    if r == 0 and impl == "tandem":
                        m = row["machine"]
                        print("cpu: %s; oneDNN %s using %s; Tandem kernels %s; torch threads %d"
                              % (cpu_model(), m["onednn"], m["onednn_isa"], m["tandem_isa"],
                                 args.threads), flush=True)
                    continue
                results.setdefault((row["model"], impl), []).append(row["samples_per_second"])
                print("round %d %-8s %-4s %9.1f samples/s" % (r + 1, impl, row["model"],
                                                              row["samples_per_second"]), flush=True)
    print()
    print("%-5s %14s %14s %8s" % ("model", "tandem", "pytorch", "ratio"))
    ok = True
    for model in args.models.split(","):
        t = statistics.median(results[(model, "tandem")])
        p = statistics.median(results[(model, "pytorch")])
        ok &= t / p >= 2.0
        print("%-5s %12.1f/s %12.1f/s %7.2fx" % (model, t, p, t / p))
    print("\ntarget >= 2.00x on every model: %s" % ("met" if ok else "NOT met"))


if __name__ == "__main__":
    main()
