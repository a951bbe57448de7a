#!/usr/bin/python3
"""Every strategy in bf16 on the emulated accelerator against the CPU engine
in bf16, in one run: `tandem train` of clients/examples/text-gpt.yaml (the
4-layer GPT, AdamW with clipping and a cosine schedule), shortened to
--steps steps with an evaluation every --eval_interval, once on the CPU engine
in fp32 and in bf16, then in bf16 under each strategy on the emulated
accelerator with the capacity that makes it offload (a fraction of the fp32
model state), everything else the same.

Prints each run's evaluation losses, their largest relative difference from
the CPU engine's in bf16 (target: within bf16's tolerance; the fp32 run shows
how far bf16 itself moves the curve), and the accelerator's peak against its
capacity (target: never above). Nothing here is a GPU figure. Needs a CPU
with AMX or AVX512-BF16.
Usage:
  /usr/bin/python3 bench/precision/strategies.py --tandem bazel-bin/clients/cli/tandem
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from machine import cpu_model  # noqa: E402

EVAL = re.compile(r"eval step (\d+): loss ([0-9.]+)")
# text-gpt.yaml's model state in fp32 with AdamW: 16 bytes per parameter.
PARAMETERS = 256 * 256 + 128 * 256 + 4 * (12 * 256 * 256 + 13 * 256) + 2 * 256 + 256 * 256 + 256

RUNS = [
    # (name, precision, strategy, accelerator, fraction of the fp32 state)
    ("cpu engine fp32", "PRECISION_FP32", None, "ACCELERATOR_KIND_NONE", 0),
    ("cpu engine bf16", "PRECISION_BF16", None, "ACCELERATOR_KIND_NONE", 0),
    ("gpu_only", "PRECISION_BF16", "STRATEGY_GPU_ONLY", "ACCELERATOR_KIND_EMULATED", 2.0),
    # Below ~55% no plan fits: a batch's activations alone take most of it.
    ("zero_offload 75%", "PRECISION_BF16", "STRATEGY_ZERO_OFFLOAD", "ACCELERATOR_KIND_EMULATED",
     0.75),
    ("reuse_distance 75%", "PRECISION_BF16", "STRATEGY_REUSE_DISTANCE",
     "ACCELERATOR_KIND_EMULATED", 0.75),
    ("reuse_distance 60%", "PRECISION_BF16", "STRATEGY_REUSE_DISTANCE",
     "ACCELERATOR_KIND_EMULATED", 0.6),
    ("hetero_dp", "PRECISION_BF16", "STRATEGY_HETERO_DP", "ACCELERATOR_KIND_EMULATED", 2.0),
    ("cpu_only", "PRECISION_BF16", "STRATEGY_CPU_ONLY", "ACCELERATOR_KIND_EMULATED", 2.0),
]


def job_file(precision, strategy, accelerator, capacity, steps, eval_interval):
    text = open(os.path.join(REPO, "clients", "examples", "text-gpt.yaml")).read()
    text = re.sub(r"^(\s+)steps: \d+", r"\g<1>steps: %d" % steps, text, flags=re.M)
    text = re.sub(r"^(\s+)eval_interval_steps: \d+",
                  r"\g<1>eval_interval_steps: %d" % eval_interval, text, flags=re.M)
    text = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", text)
    text = re.sub(r"^placement:.*?(?=^\S|\Z)", "", text, flags=re.S | re.M)
    text += "\nprecision: %s\nplacement:\n  accelerator: %s\n" % (precision, accelerator)
    if strategy:
        text += "  strategy: %s\nresources:\n  accelerator_memory_bytes: %d\n" % (strategy,
                                                                              capacity)
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def train(tandem, path):
    result = subprocess.run([tandem, "--output=json", "train", path], capture_output=True,
                            text=True)
    os.unlink(path)
    if result.returncode != 0:
        sys.exit("tandem train failed:\n%s" % result.stderr[-3000:])
    evals = [(int(m.group(1)), float(m.group(2))) for m in EVAL.finditer(result.stderr)]
    return evals, json.loads(result.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval_interval", type=int, default=50)
    args = parser.parse_args()
    state = 16 * PARAMETERS
    print("cpu: %s" % cpu_model())
    print("text-gpt, %d steps, evaluation every %d; fp32 model state %.1f MiB" % (
        args.steps, args.eval_interval, state / 2**20), flush=True)
    reference = None
    print("| run | plan | eval losses | max diff from cpu bf16 | accelerator peak / capacity |")
    print("| --- | --- | --- | --- | --- |")
    for name, precision, strategy, accelerator, fraction in RUNS:
        capacity = int(fraction * state)
        evals, job = train(args.tandem, job_file(precision, strategy, accelerator, capacity,
                                                 args.steps, args.eval_interval))
        if name == "cpu engine bf16":
            reference = evals
        worst = "-"
        if reference is not None and name != "cpu engine bf16":
            worst = "%.2f%%" % (100 * max(abs(b - a) / a for (_, a), (_, b) in
                                          zip(reference, evals)))
        plan = job.get("plan", {})
        layers = plan.get("layers", [])
        shape = "-"
        if strategy:
            streamed = sum(1 for l in layers if l.get("parameterHome", l.get("parameter_home", ""))
                           .endswith("STREAMED"))
            host = sum(1 for l in layers if l.get("update", "").endswith("HOST"))
            shape = "micro-batch %s, %d of %d layers updated on the host, %d streamed" % (
                plan.get("micro_batch_size", plan.get("microBatchSize", "?")), host, len(layers),
                streamed)
        peak = int(job.get("metrics", {}).get("peak_accelerator_bytes", 0))
        print("| %s | %s | %s | %s | %s |" % (
            name, shape, " ".join("%.4f" % l for _, l in evals), worst,
            "%.1f / %.1f MiB" % (peak / 2**20, capacity / 2**20) if strategy else "-"),
            flush=True)


if __name__ == "__main__":
    main()
