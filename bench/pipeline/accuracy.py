#!/usr/bin/python3
"""PipeDream against synchronous pipelines on Fashion-MNIST (docs/pipeline.md):
the mlp and cnn recipes of clients/examples, 2 epochs, on 2 emulated
accelerators with 4 micro-batches per batch, under 1F1B (synchronous: the
same training as one device) and under PipeDream (asynchronous 1F1B with
weight stashing: an update per micro-batch, the first stage's gradients one
update stale), with --vertical_sync under PipeDream with vertical sync
too (every stage one update stale), and with --continuous under continuous
PipeDream (no drain between steps: the bubble is paid once per run). Prints the final test accuracy of each,
the difference (target: within 0.01), the staleness each stage ran with and
the throughput.
Runs `tandem train` locally; the emulated accelerators share the host's
cores, so nothing here is a GPU figure.

  /usr/bin/python3 bench/pipeline/accuracy.py --tandem bazel-bin/clients/cli/tandem
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
sys.path.insert(0, os.path.join(REPO, "bench", "common"))
from machine import cpu_model  # noqa: E402


def job_file(model, epochs, schedule, stages, micro_batches, threads, vertical_sync=False,
             continuous=False):
    job = open(os.path.join(REPO, "clients", "examples", "fmnist-%s.yaml" % model)).read()
    job = re.sub(r"epochs: \d+", "epochs: %d" % epochs, job)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    job = job.replace("  seed: 1\n", "  seed: 1\n  threads: %d\n" % threads)
    job = job[:job.index("\nplacement:")] if "\nplacement:" in job else job
    job += ("\nplacement:\n  accelerator: ACCELERATOR_KIND_EMULATED\n"
            "  pipeline: {stages: %d, schedule: PIPELINE_SCHEDULE_%s, micro_batches: %d, "
            "vertical_sync: %s, continuous: %s}\n"
            "resources:\n  accelerator_memory_bytes: %d\n"
            % (stages, schedule, micro_batches, "true" if vertical_sync else "false",
               "true" if continuous else "false", 256 << 20))
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(job)
    f.close()
    return f.name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tandem", default=os.path.join(REPO, "bazel-bin/clients/cli/tandem"))
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro_batches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vertical_sync", action="store_true",
                        help="also run PipeDream with vertical sync")
    parser.add_argument("--continuous", action="store_true",
                        help="also run continuous PipeDream (no drain between steps)")
    args = parser.parse_args()
    print("machine: %s; %d threads per job; %d emulated accelerators (host cores, NOT GPU "
          "figures), %d micro-batches, %d epochs" % (cpu_model(), args.threads, args.stages,
                                                     args.micro_batches, args.epochs), flush=True)
    for model in args.models.split(","):
        accuracy = {}
        runs = [("ONE_F_ONE_B", False, False), ("PIPEDREAM", False, False)]
        if args.vertical_sync:
            runs.append(("PIPEDREAM", True, False))
        if args.continuous:
            runs.append(("PIPEDREAM", False, True))
        for schedule, synced, continuous in runs:
            name = schedule + ("+VS" if synced else "") + ("+CONTINUOUS" if continuous else "")
            path = job_file(model, args.epochs, schedule, args.stages, args.micro_batches,
                            args.threads, synced, continuous)
            try:
                proc = subprocess.run([args.tandem, "--output=json", "train", path],
                                      capture_output=True, text=True)
            finally:
                os.unlink(path)
            if proc.returncode != 0:
                raise RuntimeError("tandem train failed:\n" + proc.stderr[-2000:])
            m = json.loads(proc.stdout)["metrics"]
            accuracy[name] = m.get("eval_accuracy", 0)
            stages = m.get("pipeline_stages", [])
            print("%-4s %-12s accuracy %.4f  loss %.4f  %7.0f samples/s  %6.1f s  staleness per "
                  "stage %s, updates per step %s" % (
                      model, name.lower(), accuracy[name], m.get("eval_loss", 0),
                      m.get("mean_samples_per_second", 0), m.get("train_seconds", 0),
                      [s.get("staleness", 0) for s in stages],
                      [s.get("updates", 0) for s in stages]), flush=True)
        for name in accuracy:
            if name != "ONE_F_ONE_B":
                print("%-4s %s - 1f1b: %+.4f (target within 0.01)" % (
                    model, name.lower(), accuracy[name] - accuracy["ONE_F_ONE_B"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
