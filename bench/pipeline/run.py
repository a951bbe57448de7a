#!/usr/bin/python3
"""Pipelines on emulated accelerators (placement.pipeline, docs/pipeline.md):
the gpt and cnn recipes of clients/examples cut into 2 and 4 stages under GPipe
and 1F1B, next to the same job on one emulated accelerator at the same
micro-batches (the peer, measured in this run). Per run: the plan's predicted
step against the measured one, each stage's bubble fraction (bubble over the
forward-backward phase) next to GPipe's (K-1)/(M+K-1), each stage's memory
peak against the planner's prediction for it, and the final loss against the
one-device run's.

Starts its own tandemd with --emulated_accelerators=4 (one node profile for
every job, measured at its start) and runs the jobs one at a time.

The emulated accelerators compute on the host's cores: K stages on a 2-core
machine share those cores, so their busy times stretch and what looks like a
bubble is partly a stage waiting for a core. Nothing here is a GPU figure.

  /usr/bin/python3 bench/pipeline/run.py --tandemd bazel-bin/server/tandemd \\
      --tandem bazel-bin/clients/cli/tandem
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench", "common"))
from machine import cpu_model  # noqa: E402

# model -> (example file, micro-batches, accelerator memory per stage)
MODELS = {
    "gpt": ("text-gpt-pipeline.yaml", 8, 128 << 20),
    "cnn": ("fmnist-cnn.yaml", 8, 128 << 20),
}


def job_file(model, steps, stages, schedule, threads):
    example, micro_batches, memory = MODELS[model]
    job = open(os.path.join(REPO, "clients", "examples", example)).read()
    job = re.sub(r"\n  (epochs|steps): \d+", "\n  steps: %d" % steps, job)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    job = re.sub(r"eval_interval_steps: \d+.*", "eval_interval_steps: %d" % steps, job)
    job = re.sub(r"log_interval_steps: \d+.*", "log_interval_steps: %d" % steps, job)
    job = job.replace("  seed: 1\n", "  seed: 1\n  threads: %d\n" % threads)
    # Everything from placement: on is this run's.
    job = job[:job.index("\nplacement:")] if "\nplacement:" in job else job
    job = job.replace("  checkpoint_disabled: true\n  checkpoint_disabled: true\n",
                      "  checkpoint_disabled: true\n")
    batch = int(re.search(r"batch_size: (\d+)", job).group(1))
    job += "\nplacement:\n  accelerator: ACCELERATOR_KIND_EMULATED\n"
    if stages > 1:
        job += ("  pipeline: {stages: %d, schedule: PIPELINE_SCHEDULE_%s, micro_batches: %d}\n"
                % (stages, schedule, micro_batches))
    else:
        job += "  strategy: STRATEGY_GPU_ONLY\n  micro_batch_size: %d\n" % (batch // micro_batches)
    job += "resources:\n  accelerator_memory_bytes: %d\n" % (memory if stages > 1 else 4 * memory)
    job += "precision: PRECISION_FP32\n"  # pipelines run fp32; one device too
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(job)
    f.close()
    return f.name


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(tandem, server, argv):
    proc = subprocess.run([tandem, "--server=" + server, "--output=json"] + argv,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError("tandem %s failed: %s" % (" ".join(argv), proc.stderr.strip()[-2000:]))
    return json.loads(proc.stdout)


def run(tandem, server, path):
    job = cli(tandem, server, ["submit", path])
    while job["state"] not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
        time.sleep(0.5)
        job = cli(tandem, server, ["status", job["id"]])
    if job["state"] != "JOB_STATE_SUCCEEDED":
        raise RuntimeError("%s: %s" % (job["state"], job.get("reason", "")))
    return job


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tandem", default=os.path.join(REPO, "bazel-bin/clients/cli/tandem"))
    parser.add_argument("--tandemd", default=os.path.join(REPO, "bazel-bin/server/tandemd"))
    parser.add_argument("--models", default="gpt,cnn")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json_out", default="")
    args = parser.parse_args()
    print("machine: %s; %d threads per job; emulated accelerators (host cores, NOT GPU "
          "figures)" % (cpu_model(), args.threads), flush=True)
    state_dir = tempfile.mkdtemp(prefix="tandem-pipeline-bench-")
    server = "127.0.0.1:%d" % free_port()
    log = open(os.path.join(state_dir, "tandemd.log"), "w")
    daemon = subprocess.Popen([args.tandemd, "--state_dir=%s/state" % state_dir,
                               "--listen=" + server,
                               "--metrics_listen=127.0.0.1:%d" % free_port(),
                               "--data_root=/usr/share", "--max_running_jobs=1",
                               "--emulated_accelerators=4"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if subprocess.run([args.tandem, "--server=" + server, "node"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        return bench(args, server)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
        shutil.rmtree(state_dir, ignore_errors=True)


def bench(args, server):
    rows = []
    within = total = 0
    for model in args.models.split(","):
        base = None
        for stages, schedule in [(1, ""), (2, "GPIPE"), (2, "ONE_F_ONE_B"), (4, "GPIPE"),
                                 (4, "ONE_F_ONE_B")]:
            path = job_file(model, args.steps, stages, schedule, args.threads)
            try:
                job = run(args.tandem, server, path)
            finally:
                os.unlink(path)
            m = job["metrics"]
            plan = job.get("plan", {})
            pred = m.get("predicted_step_seconds", 0)
            meas = m.get("measured_step_seconds", 0)
            err = meas / pred - 1 if pred and meas else float("nan")
            name = "one device" if stages == 1 else "%d x %s" % (stages, schedule.lower())
            M = plan.get("micro_batches", 0)
            line = ("%-4s %-16s M=%-2d predicted %7.1f ms  measured %7.1f ms  (%+6.1f%%)  "
                    "loss %.5f" % (model, name, M, pred * 1e3, meas * 1e3, err * 100, m["loss"]))
            if stages == 1:
                base = m
            else:
                total += 1
                within += abs(err) <= 0.10
                line += "  (one device %.5f)  step x%.2f of one device" % (
                    base["loss"], meas / base["measured_step_seconds"])
            print(line, flush=True)
            stage_rows = []
            for s in m.get("pipeline_stages", []):
                phase = s.get("busy_seconds", 0) + s.get("bubble_seconds", 0) + s.get(
                    "copy_seconds", 0)
                bubble = s.get("bubble_seconds", 0) / phase if phase else 0
                print("      stage %d layers %2d-%-2d busy %7.1f ms  bubble %5.1f%% (GPipe formula "
                      "%4.1f%%)  copies %5.1f ms  peak %6.1f MiB of %6.1f predicted" % (
                          s.get("stage", 0), s.get("first_layer", 0), s.get("last_layer", 0),
                          s.get("busy_seconds", 0) * 1e3, bubble * 100,
                          100.0 * (stages - 1) / (M + stages - 1),
                          s.get("copy_seconds", 0) * 1e3, int(s.get("peak_bytes", 0)) / 2**20,
                          int(s.get("predicted_bytes", 0)) / 2**20))
                stage_rows.append(s)
            rows.append({"model": model, "stages": stages, "schedule": schedule,
                         "predicted": pred, "measured": meas, "loss": m["loss"],
                         "stages_stats": stage_rows})
    print("pipelines within 10%% of their predicted step: %d of %d" % (within, total))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
