#!/usr/bin/python3
"""Update rules on Fashion-MNIST (JobSpec.updates, docs/update-rules.md): for the
mlp and cnn recipes of clients/examples, synchronous training next to Hogwild
with 1, 2 and 4 workers, EASGD with tau = 1, 4 and 16, the parameter server
with staleness 0, 2 and 8, and SWA, all in this run: final test accuracy, wall
time to the first evaluation at or above --target (evaluations every
--eval_every steps, their own time included), throughput and what the rule
did (staleness, exchanges). --swa_epochs adds SWA on the cnn for that many
epochs: the averaged model's accuracy next to the last iterate's.

The parameter server runs 4 workers (8 for s = 8, so that the bound can
bind); EASGD 2 replicas with alpha 0.1. Every rule runs on the same --threads; on a 2-core machine the workers of
Hogwild and the parameter server share those 2 cores, so the asynchronous
rules cannot run faster than synchronous here: what this compares is the
accuracy each rule reaches per sample and its overhead."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "common"))
from machine import cpu_model  # noqa: E402

EVAL = re.compile(r"eval step (\d+): loss ([0-9.]+) accuracy ([0-9.]+)")
ISA = re.compile(r"onednn_verbose,info,cpu,isa:(.*)")

RULES = [
    ("synchronous", "{synchronous: {}}"),
    ("hogwild w=1", "{hogwild: {workers: 1}}"),
    ("hogwild w=2", "{hogwild: {workers: 2}}"),
    ("hogwild w=4", "{hogwild: {workers: 4}}"),
    ("easgd tau=1", "{easgd: {replicas: 2, period: 1}}"),
    ("easgd tau=4", "{easgd: {replicas: 2, period: 4}}"),
    ("easgd tau=16", "{easgd: {replicas: 2, period: 16}}"),
    ("ps s=0", "{parameter_server: {staleness: 0, workers: 4}}"),
    ("ps s=2", "{parameter_server: {staleness: 2, workers: 4}}"),
    ("ps s=8", "{parameter_server: {staleness: 8, workers: 8}}"),
    ("swa", "{swa: {}}"),
]


def job_file(model, epochs, updates, eval_every, threads):
    example = open(os.path.join(REPO, "clients", "examples", "fmnist-%s.yaml" % model)).read()
    job = re.sub(r"epochs: \d+", "epochs: %d" % epochs, example)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    job = re.sub(r"eval_interval_steps: \d+.*", "eval_interval_steps: %d" % eval_every, job)
    job = job.replace("  seed: 1\n", "  seed: 1\n  threads: %d\n" % threads)
    job += "updates: %s\n" % updates
    # fp32 for every rule (Hogwild and the parameter server compute in fp32).
    job += "precision: PRECISION_FP32\n"
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(job)
    f.close()
    return f.name


def run(tandem, path, target):
    """(evals as (seconds, step, accuracy), the final Job as JSON, seconds to target)."""
    start = time.monotonic()
    proc = subprocess.Popen([tandem, "--output=json", "train", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    evals = []
    log = []
    for line in proc.stderr:
        log.append(line)
        m = EVAL.search(line)
        if m:
            evals.append((time.monotonic() - start, int(m.group(1)), float(m.group(3))))
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError("tandem train failed:\n" + "".join(log[-20:]))
    job = json.loads(out)
    reached = next((t for t, _, a in evals if a >= target), None)
    return evals, job, reached, "".join(log)


def onednn_isa(tandem):
    """The ISA oneDNN dispatches to here, from its verbose banner on a one-step job."""
    path = job_file("mlp", 1, "{synchronous: {}}", 1000, 1)
    text = open(path).read().replace("epochs: 1", "steps: 1")
    open(path, "w").write(text)
    try:
        out = subprocess.run([tandem, "train", path], capture_output=True, text=True,
                             env=dict(os.environ, ONEDNN_VERBOSE="1"))
    finally:
        os.unlink(path)
    m = ISA.search(out.stdout + out.stderr)
    return m.group(1).strip() if m else "not reported"


def describe(name, evals, job, reached, target):
    m = job.get("metrics", {})
    u = m.get("updates", {})
    extra = []
    if "mean_staleness" in u or "max_staleness" in u:
        extra.append("staleness mean %.2f max %s" % (u.get("mean_staleness", 0),
                                                    u.get("max_staleness", 0)))
    if u.get("wait_seconds"):
        extra.append("waited %.1f s" % u["wait_seconds"])
    if u.get("exchanges"):
        extra.append("%s exchanges" % u["exchanges"])
    if u.get("swa_models"):
        extra.append("SWA average of %s models: accuracy %.4f (last iterate %.4f)" % (
            u["swa_models"], u.get("swa_eval_accuracy", 0), m.get("eval_accuracy", 0)))
    return "  %-13s accuracy %.4f  to %.2f: %s  %7.0f samples/s  %6.1f s  %s" % (
        name, m.get("eval_accuracy", 0), target,
        "%6.1f s (step %d)" % (reached, next(s for t, s, a in evals if a >= target))
        if reached is not None else "   not reached   ",
        m.get("mean_samples_per_second", 0), m.get("train_seconds", 0), "; ".join(extra))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval_every", type=int, default=94)  # five times an epoch
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rules", default="", help="comma-separated names; default all")
    parser.add_argument("--swa_epochs", type=int, default=0)
    args = parser.parse_args()
    print("machine: %s; oneDNN ISA: %s; %d threads per job" % (
        cpu_model(), onednn_isa(args.tandem), args.threads), flush=True)
    wanted = set(r for r in args.rules.split(",") if r)
    for model in args.models.split(","):
        print("%s, %d epochs (batch 128, Adam 1e-3):" % (model, args.epochs), flush=True)
        for name, updates in RULES:
            if wanted and name not in wanted:
                continue
            path = job_file(model, args.epochs, updates, args.eval_every, args.threads)
            try:
                evals, job, reached, _ = run(args.tandem, path, args.target)
            finally:
                os.unlink(path)
            print(describe(name, evals, job, reached, args.target), flush=True)
    if args.swa_epochs > 0:
        swa_every = 469 * args.swa_epochs
        path = job_file("cnn", args.swa_epochs, "{swa: {}}", swa_every, args.threads)
        try:
            evals, job, reached, _ = run(args.tandem, path, args.target)
        finally:
            os.unlink(path)
        print("cnn, %d epochs, SWA from 75%% of the run, every step:" % args.swa_epochs)
        print(describe("swa", evals, job, reached, args.target), flush=True)


if __name__ == "__main__":
    main()
