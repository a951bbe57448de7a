#!/usr/bin/python3
"""Data parallelism on Fashion-MNIST (docs/distributed.md): the mlp recipe of
clients/examples (Adam, batch 128, 2 epochs) as one replica and as a
distributed job of 2 and 4 ranks, replicated and ZeRO-partitioned, on a
cluster of 4 tandemd daemons on loopback. Prints each run's final test
accuracy, its difference from one replica (target: within 0.01), the wall
time, and rank 0's communication. All daemons share this machine's cores
(one thread per job each), so the times say what the communication costs
here, not how training scales across machines.

  /usr/bin/python3 bench/dist/fmnist.py --tandemd bazel-bin/server/tandemd \\
      --tandem bazel-bin/clients/cli/tandem [--strategy=zero_offload]

With --strategy every rank runs that plan on its daemon's emulated
accelerator (docs/distributed.md, "Ranks that run a plan"); partitioned, the
ranks cut the optimizer state the plan keeps on the host.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "common"))
from machine import cpu_model  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
from repo_files import free_ports  # noqa: E402


def job_file(workdir, epochs, replicas, sharding, strategy=None):
    job = open(os.path.join(REPO, "clients", "examples", "fmnist-mlp.yaml")).read()
    job = re.sub(r"epochs: \d+", "epochs: %d" % epochs, job)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    job = job.replace("  seed: 1\n", "  seed: 1\n  threads: 1\n")
    # fp32 as in earlier runs: auto would be bf16 on a CPU that computes it natively.
    job += "precision: PRECISION_FP32\n"
    if strategy:
        job += ("placement:\n  accelerator: ACCELERATOR_KIND_EMULATED\n  strategy: STRATEGY_%s\n"
                "resources:\n  accelerator_memory_bytes: 268435456\n" % strategy.upper())
    if replicas > 1:
        job += "distributed:\n  replicas: %d\n  sharding: OPTIMIZER_SHARDING_%s\n" % (replicas,
                                                                                     sharding)
    path = os.path.join(workdir, "job-%d-%s.yaml" % (replicas, sharding))
    with open(path, "w") as f:
        f.write(job)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tandemd", default=os.path.join(REPO, "bazel-bin/server/tandemd"))
    parser.add_argument("--tandem", default=os.path.join(REPO, "bazel-bin/clients/cli/tandem"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--daemons", type=int, default=4)
    parser.add_argument("--strategy", default="",
                        help="e.g. zero_offload: every rank runs this plan on its daemon's "
                        "emulated accelerator instead of the CPU engine")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="tandem-dist-fmnist-")
    ports = free_ports(args.daemons)
    addresses = ["127.0.0.1:%d" % p for p in ports]
    procs = []
    try:
        for i, address in enumerate(addresses):
            state = os.path.join(workdir, "state%d" % i)
            os.makedirs(state)
            log = open(os.path.join(workdir, "tandemd%d.log" % i), "wb")
            procs.append(subprocess.Popen(
                [args.tandemd, "--listen=" + address, "--state_dir=" + state,
                 "--metrics_listen=", "--data_root=/usr/share", "--job_threads=1",
                 "--peers=" + ",".join(a for a in addresses if a != address)],
                stdout=log, stderr=subprocess.STDOUT))
        time.sleep(3)  # the peers' first health checks
        print("machine: %s; %d tandemd daemons on loopback, 1 thread per rank; mlp, batch 128, "
              "%d epochs; ranks on %s" % (
                  cpu_model(), args.daemons, args.epochs,
                  "the CPU engine" if not args.strategy else
                  "emulated accelerators, plan " + args.strategy), flush=True)
        print("%-8s %-12s %10s %10s %9s %14s %12s" % ("ranks", "sharding", "accuracy",
                                                      "vs 1 rank", "wall s", "collective GB",
                                                      "Adam floats"), flush=True)
        baseline = None
        runs = ((1, "-"), (2, "REPLICATED"), (2, "PARTITIONED"), (4, "REPLICATED"),
                (4, "PARTITIONED"))
        for replicas, sharding in runs:
            if replicas > args.daemons:
                continue
            path = job_file(workdir, args.epochs, replicas, sharding, args.strategy)
            start = time.time()
            out = subprocess.run([args.tandem, "--server=" + addresses[0], "submit", path,
                                  "--watch"], capture_output=True, text=True, timeout=7200)
            wall = time.time() - start
            if "JOB_STATE_SUCCEEDED" not in out.stdout:
                print("%d ranks %s failed:\n%s%s" % (replicas, sharding, out.stdout[-2000:],
                                                     out.stderr[-2000:]))
                continue
            job_id = out.stdout.split()[1]
            status = subprocess.run([args.tandem, "--server=" + addresses[0], "--output=json",
                                     "status", job_id], capture_output=True, text=True)
            job = json.loads(status.stdout)
            accuracy = job["metrics"]["eval_accuracy"]
            d = job["metrics"].get("distributed", {})
            if baseline is None:
                baseline = accuracy
            print("%-8d %-12s %10.4f %+10.4f %9.1f %14.2f %12s" % (
                replicas, sharding.lower(), accuracy, accuracy - baseline, wall,
                int(d.get("collectiveBytes", d.get("collective_bytes", 0))) / 1e9,
                d.get("optimizerElements", d.get("optimizer_elements", "-"))), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
