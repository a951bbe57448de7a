#!/usr/bin/python3
"""Mixed-precision offload against fp32 offload, in one run, on the emulated
accelerator: `tandem train` of a text GPT (8 layers, d_model 256, context 128,
batch 16, AdamW) under zero_offload and reuse_distance, each once with
PRECISION_FP32 and once with PRECISION_BF16, everything else the same: the
accelerator's capacity (default 50% of the fp32 model state) and its link
capped (default 0.2 GB/s).

Why a slow link: the emulated accelerator computes on this machine's cores, a
few hundred GFLOP/s, so a link of a few GB/s would make copies vanish beside
compute; an H100's ratio of tensor-core FLOPs to PCIe bytes is ~16,000, which
at 2 cores' rate is a link of ~15 MB/s. 0.2 GB/s keeps the copies on the
critical path without dwarfing the rest.

Prints, per run: the plan's predicted step and bytes each way per step, the
measured step (mean after the first two), samples/s, the accelerator's peak
against the plan's predicted peak, and the final training loss; then bf16's
speedup over fp32 per strategy. Nothing here is a GPU figure. Needs a CPU with
AMX or AVX512-BF16 (tandem refuses bf16 elsewhere).
Usage:
  /usr/bin/python3 bench/precision/offload.py --tandem bazel-bin/clients/cli/tandem
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from machine import cpu_model  # noqa: E402

JOB = """display_name: offload-%(strategy)s-%(precision)s
model:
  gpt: {n_layer: %(layers)d, n_head: 4, d_model: 256, context: 128}
data:
  text:
    path: /usr/share/vim/vim90/doc/version8.txt
    test_fraction: 0.05
    samples_per_epoch: 16000
optimizer:
  kind: OPTIMIZER_KIND_ADAMW
  learning_rate: 0.001
  weight_decay: 0.01
training:
  batch_size: 16
  steps: %(steps)d
  seed: 1
  threads: 2
  log_interval_steps: 10
  checkpoint_disabled: true
precision: %(precision)s
placement:
  strategy: %(strategy)s
  accelerator: ACCELERATOR_KIND_EMULATED
resources:
  accelerator_memory_bytes: %(capacity)d
  emulated_link_bytes_per_second: %(link)g
"""


def gpt_parameters(layers, d=256, vocab=256, context=128):
    """Parameters of the gpt preset (embeddings, blocks, final norm and head),
    near enough to size the capacity: 12 d^2 + 13 d per block."""
    return vocab * d + context * d + layers * (12 * d * d + 13 * d) + 2 * d + d * vocab + vocab


def train(tandem, fields):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(JOB % fields)
        path = f.name
    result = subprocess.run([tandem, "--output=json", "train", path], capture_output=True,
                            text=True)
    os.unlink(path)
    if result.returncode != 0:
        sys.exit("tandem train (%(strategy)s, %(precision)s) failed:\n" % fields +
                 result.stderr[-3000:])
    return json.loads(result.stdout)


def mib(b):
    return "%.1f MiB" % (int(b) / 2**20)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="accelerator capacity as a fraction of the fp32 model state")
    parser.add_argument("--link", type=float, default=0.2e9, help="bytes per second")
    parser.add_argument("--strategies", default="zero_offload,reuse_distance")
    args = parser.parse_args()
    state = 16 * gpt_parameters(args.layers)
    capacity = int(args.fraction * state)
    print("cpu: %s" % cpu_model())
    print("gpt %d layers, model state %s (fp32 Adam), accelerator %s, link %.2f GB/s, %d steps"
          % (args.layers, mib(state), mib(capacity), args.link / 1e9, args.steps), flush=True)
    print("| strategy | precision | micro-batch | predicted step | H2D / D2H per step | "
          "measured step | samples/s | peak / predicted | loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    speed = {}
    for strategy in args.strategies.split(","):
        for precision in ("PRECISION_FP32", "PRECISION_BF16"):
            job = train(args.tandem, {
                "strategy": "STRATEGY_" + strategy.upper(), "precision": precision,
                "layers": args.layers, "steps": args.steps, "capacity": capacity,
                "link": args.link})
            m = job.get("metrics", {})
            p = job.get("plan", {}).get("prediction", {})
            measured = m.get("measured_step_seconds", 0)
            speed[(strategy, precision)] = measured
            print("| %s | %s | %s | %.0f ms | %s / %s | %.0f ms | %.1f | %s / %s | %.4f |" % (
                strategy, precision[len("PRECISION_"):].lower(),
                job.get("plan", {}).get("micro_batch_size", "?"),
                1e3 * p.get("iteration_seconds", 0), mib(p.get("h2d_bytes", 0)),
                mib(p.get("d2h_bytes", 0)), 1e3 * measured, m.get("mean_samples_per_second", 0),
                mib(m.get("peak_accelerator_bytes", 0)), mib(p.get("accelerator_peak_bytes", 0)),
                m.get("loss", 0)), flush=True)
    for strategy in args.strategies.split(","):
        a, b = speed[(strategy, "PRECISION_FP32")], speed[(strategy, "PRECISION_BF16")]
        if a > 0 and b > 0:
            print("%s: bf16 step %.2fx faster than fp32" % (strategy, a / b))


if __name__ == "__main__":
    main()
