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
    parser.add_argument("--precisions", default="fp32,bf16",
                        help="fp32, and bf16 (Tandem's bf16 matrix products against "
                             "torch.autocast with bfloat16)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    common = ["--models=" + args.models, "--threads=%d" % args.threads,
              "--seconds=%g" % args.seconds]
    results = {}
    machine = {}
    unavailable = {}

    def run(r, impl, cmd):
        for row in run_json(cmd):
            if "unavailable" in row:
                unavailable[row["precision"]] = row["unavailable"]
            elif "machine" in row:
                if not machine:
                    machine.update(row["machine"])
                    print("cpu: %s; oneDNN %s using %s; Tandem kernels %s; torch %s, threads %d"
                          % (cpu_model(), machine["onednn"], machine["onednn_isa"],
                             machine["tandem_isa"], torch_version(), args.threads), flush=True)
            else:
                key = (row["model"], impl, row.get("precision", "fp32"))
                results.setdefault(key, []).append(row["samples_per_second"])
                print("round %d %-8s %-4s %-4s %9.1f samples/s" % (r + 1, impl, key[2],
                                                                   row["model"],
                                                                   row["samples_per_second"]),
                      flush=True)

    for r in range(args.rounds):
        # Tandem first: it says which precisions this CPU has; PyTorch runs those.
        run(r, "tandem", [args.tandem] + common + ["--precisions=" + ",".join(precisions)])
        precisions = [p for p in precisions if p not in unavailable]
        for p in precisions:
            run(r, "pytorch", [sys.executable, os.path.join(HERE, "torch_peer.py")] + common +
                ["--precision=" + p])
    isa = machine.get("onednn_isa")
    for p, why in unavailable.items():
        print("%s: not run (%s)" % (p, why))
    median = {k: statistics.median(v) for k, v in results.items()}
    print()
    print("%-5s %-5s %12s %12s %8s" % ("model", "prec", "tandem", "pytorch", "ratio"))
    for model in args.models.split(","):
        for p in precisions:
            t, q = median[(model, "tandem", p)], median[(model, "pytorch", p)]
            print("%-5s %-5s %10.1f/s %10.1f/s %7.2fx" % (model, p, t, q, t / q))
    if "fp32" in precisions:
        ok = all(median[(m, "tandem", "fp32")] / median[(m, "pytorch", "fp32")] >= 2.0
                 for m in args.models.split(","))
        print("\nfp32: target >= 2.00x PyTorch fp32 on every model: %s"
              % ("met" if ok else "NOT met"))
    if "bf16" in precisions:
        native = isa in ("avx512_core_bf16", "avx512_core_amx")
        print("bf16 (oneDNN %s: %s):" % (isa, "native bf16" if native else
                                         "NO native bf16, bf16 is emulated; these rows say nothing "
                                         "about AMX or AVX512-BF16"))
        ok = True
        for model in args.models.split(","):
            faster = max(median[(model, "pytorch", p)] for p in precisions)
            ratio = median[(model, "tandem", "bf16")] / faster
            ok &= ratio >= 1.5
            line = "  %-4s Tandem bf16 / faster PyTorch (fp32 or autocast bf16): %.2fx" % (model, ratio)
            if "fp32" in precisions:
                line += "; Tandem bf16 / Tandem fp32: %.2fx" % (
                    median[(model, "tandem", "bf16")] / median[(model, "tandem", "fp32")])
            print(line)
        print("target >= 1.50x the faster PyTorch on every model: %s" % ("met" if ok else "NOT met"))
        if "fp32" in precisions and "gpt" in args.models.split(","):
            gpt = median[("gpt", "tandem", "bf16")] / median[("gpt", "tandem", "fp32")]
            print("target Tandem bf16 >= 1.50x Tandem fp32 on gpt: %s (%.2fx)"
                  % ("met" if gpt >= 1.5 else "NOT met", gpt))


def torch_version():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
