#!/usr/bin/python3
"""Pipelines on emulated accelerators (placement.pipeline, docs/pipeline.md):
the gpt and cnn recipes of clients/examples cut into 2 and 4 stages under GPipe
and 1F1B (--pipedream: PipeDream drained at each step and continuous), next to the same job on one emulated accelerator at the same
micro-batches (the peer, measured in this run). Per run: the plan's predicted
step against the measured one, each stage's bubble fraction (bubble over the
forward-backward phase) next to GPipe's (K-1)/(M+K-1), each stage's memory
peak against the planner's prediction for it, and the final loss against the
one-device run's.

Starts its own tandemd with --emulated_accelerators=4 (one node profile for
every job, measured at its start) and runs the jobs one at a time. The
stages copy activations and gradients between their devices over the
emulated peer link (one copy at the host link's rate); --staged starts the
daemon with --emulated_peer_link=false, so that they go down to the host and
up again (two copies), as between GPUs without peer access; --link_mbps caps
the links so that the copies show.

The emulated accelerators compute on the host's cores, each stage with its
share of the job's threads (at least one): with more stages than threads they
take turns on the cores, so their busy times stretch and what looks like a
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


def base_job(model, steps, threads):
    """The example's job, `steps` steps on `threads` threads, up to its placement."""
    example = MODELS[model][0]
    job = open(os.path.join(REPO, "clients", "examples", example)).read()
    job = re.sub(r"\n  (epochs|steps): \d+", "\n  steps: %d" % steps, job)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    job = re.sub(r"eval_interval_steps: \d+.*", "eval_interval_steps: %d" % steps, job)
    job = re.sub(r"log_interval_steps: \d+.*", "log_interval_steps: %d" % steps, job)
    job = job.replace("  seed: 1\n", "  seed: 1\n  threads: %d\n" % threads)
    # Everything from placement: on is this run's.
    job = job[:job.index("\nplacement:")] if "\nplacement:" in job else job
    return job.replace("  checkpoint_disabled: true\n  checkpoint_disabled: true\n",
                       "  checkpoint_disabled: true\n")


def write_job(job):
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(job)
    f.close()
    return f.name


def job_file(model, steps, stages, schedule, threads, measured_profile=False, stage_memory=0,
             no_clipping=False, link_bytes_per_second=0):
    _, micro_batches, memory = MODELS[model]
    job = base_job(model, steps, threads)
    if no_clipping:  # PipeDream refuses it (it needs the whole model's norm first)
        job = re.sub(r"\n  max_grad_norm: [0-9.]+", "", job)
    batch = int(re.search(r"batch_size: (\d+)", job).group(1))
    job += "\nplacement:\n  accelerator: ACCELERATOR_KIND_EMULATED\n"
    if stages > 1:
        # "PIPEDREAM_CONTINUOUS": PipeDream whose pipeline stays full between steps.
        continuous = schedule.endswith("_CONTINUOUS")
        job += ("  pipeline: {stages: %d, schedule: PIPELINE_SCHEDULE_%s, micro_batches: %d%s}\n"
                % (stages, schedule.replace("_CONTINUOUS", ""), micro_batches,
                   ", continuous: true" if continuous else ""))
    else:
        job += "  strategy: STRATEGY_GPU_ONLY\n  micro_batch_size: %d\n" % (batch // micro_batches)
        if measured_profile:
            # Re-planned at once: tandemd measures the model's layer profile
            # on this node and caches it, and the pipelines after it are
            # planned from it, as any later job of this model here would be.
            job += "  replan_threshold: 1e-9\n"
    if stages > 1 and stage_memory:
        memory = stage_memory
    job += "resources:\n  accelerator_memory_bytes: %d\n" % (memory if stages > 1 else 4 * memory)
    if link_bytes_per_second:
        job += "  emulated_link_bytes_per_second: %g\n" % link_bytes_per_second
    job += "precision: PRECISION_FP32\n"  # pipelines run fp32; one device too
    return write_job(job)


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
    parser.add_argument("--measured_profile", action="store_true",
                        help="the one-device job measures the model's layer profile (it is "
                        "re-planned at once) and the pipelines are planned from it")
    parser.add_argument("--stage_mib", type=float, default=0,
                        help="each pipeline stage's accelerator memory (default: the model's "
                        "128 MiB); a tight one makes stages recompute or offload their "
                        "optimizer state, as the plan's note says")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each pipeline this many times in a row on the same daemon: "
                        "the second and later are planned with what the earlier ones' stages "
                        "measured")
    parser.add_argument("--pipedream", action="store_true",
                        help="PipeDream pipelines instead, drained at each step's end and "
                        "continuous (no drain between steps); not one device's training, so "
                        "their losses differ from its; every job without gradient clipping")
    parser.add_argument("--auto", default="",
                        help="MIB:BYTES_PER_SECOND: instead, placement.pipeline.auto_stages at "
                        "that memory per accelerator and link cap, next to one accelerator "
                        "and 2 and 4 stages asked for by name")
    parser.add_argument("--staged", action="store_true",
                        help="tandemd --emulated_peer_link=false: activations and gradients "
                        "between stages through host memory")
    parser.add_argument("--link_mbps", type=float, default=0,
                        help="every job's emulated links (host and peer) capped at this many "
                        "MB/s (resources.emulated_link_bytes_per_second)")
    args = parser.parse_args()
    print("machine: %s; %d threads per job; emulated accelerators (host cores, NOT GPU "
          "figures); stages copy %s%s" % (
              cpu_model(), args.threads,
              "through host memory" if args.staged else "over the peer link",
              ", links capped at %g MB/s" % args.link_mbps if args.link_mbps else ""),
          flush=True)
    state_dir = tempfile.mkdtemp(prefix="tandem-pipeline-bench-")
    server = "127.0.0.1:%d" % free_port()
    log = open(os.path.join(state_dir, "tandemd.log"), "w")
    daemon = subprocess.Popen([args.tandemd, "--state_dir=%s/state" % state_dir,
                               "--listen=" + server,
                               "--metrics_listen=127.0.0.1:%d" % free_port(),
                               "--data_root=/usr/share", "--max_running_jobs=1",
                               "--emulated_accelerators=4",
                               "--emulated_peer_link=%s" % ("false" if args.staged else "true")],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if subprocess.run([args.tandem, "--server=" + server, "node"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        return auto_bench(args, server) if args.auto else bench(args, server)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
        shutil.rmtree(state_dir, ignore_errors=True)


def closed_loop(history):
    """The closed loop's plans (Job.plan_history): each plan's prediction
    against the steps measured under it, and whether it moved the split or
    re-timed it. None when the job ran one plan."""
    if len(history) < 2:
        return None
    parts = []
    for i, h in enumerate(history):
        pred = h.get("predicted_step_seconds", 0)
        meas = h.get("measured_step_seconds", 0)
        split = " | ".join("%d-%d" % (st.get("first_layer", 0), st.get("last_layer", 0))
                           for st in h.get("plan", {}).get("pipeline", []))
        how = "" if i == 0 else ("new split " if history[i - 1].get("placement_changed")
                                 else "re-timed ")
        parts.append("%sfrom step %s [%s] %.1f/%.1f ms" % (
            how, h.get("from_step", 0), split, pred * 1e3, meas * 1e3))
    last = history[-1]
    pred = last.get("predicted_step_seconds", 0)
    meas = last.get("measured_step_seconds", 0)
    error = meas / pred - 1 if pred and meas else float("nan")
    return {"line": "closed loop (predicted/measured): " + "; ".join(parts) +
            "  -> last plan %+.1f%%" % (error * 100), "error": error}


def bench(args, server):
    rows = []
    within = total = 0
    loop_within = loop_total = 0
    submitted = {}  # run index -> [within 10%, pipelines]
    for model in args.models.split(","):
        base = None
        schedules = (["PIPEDREAM", "PIPEDREAM_CONTINUOUS"] if args.pipedream
                     else ["GPIPE", "ONE_F_ONE_B"])
        runs = [(1, "", 0)] + [(k, x, r) for k in (2, 4) for x in schedules
                               for r in range(args.repeat)]
        for stages, schedule, again in runs:
            path = job_file(model, args.steps, stages, schedule, args.threads,
                            args.measured_profile, int(args.stage_mib * 2**20), args.pipedream,
                            args.link_mbps * 1e6)
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
            if args.repeat > 1 and stages > 1:
                name += " #%d" % (again + 1)
            M = plan.get("micro_batches", 0)
            history = job.get("plan_history", [{}])
            source = history[0].get("cost_source", "")
            line = ("%-4s %-16s M=%-2d predicted %7.1f ms  measured %7.1f ms  (%+6.1f%%)  "
                    "loss %.5f  [%s]" % (model, name, M, pred * 1e3, meas * 1e3, err * 100,
                                        m["loss"], "measured profile" if "measured here" in source
                                        else "analytic"))
            if stages == 1:
                base = m
            else:
                total += 1
                within += abs(err) <= 0.10
                line += "  (one device %.5f)  step x%.2f of one device" % (
                    base["loss"], meas / base["measured_step_seconds"])
            print(line, flush=True)
            if stages > 1:
                # The plan it was submitted with against the steps run under it.
                sub_pred = history[0].get("predicted_step_seconds", 0)
                sub_meas = history[0].get("measured_step_seconds", 0)
                sub_err = sub_meas / sub_pred - 1 if sub_pred and sub_meas else float("nan")
                submitted.setdefault(again, [0, 0])
                submitted[again][0] += abs(sub_err) <= 0.10
                submitted[again][1] += 1
                print("      submitted plan: predicted %.1f ms, measured %.1f ms under it "
                      "(%+.1f%%)%s" % (sub_pred * 1e3, sub_meas * 1e3, sub_err * 100,
                                       ", its stages corrected by an earlier job's"
                                       if "corrected by what job" in source else ""), flush=True)
            loop = closed_loop(history)
            if loop:
                print("      " + loop["line"], flush=True)
                if stages > 1:
                    loop_total += 1
                    loop_within += abs(loop["error"]) <= 0.10
            modes = ["%d:%s" % (i, " ".join(
                         name for key, name in (("recompute", "recompute"),
                                                ("offload_activations", "offload activations"),
                                                ("wait_for_activation_copies",
                                                 "(waiting for each copy)"),
                                                ("offload_optimizer", "offload optimizer"),
                                                ("stream_weights", "stream weights"))
                         if st.get(key))
                     + (" (last %d layers)" % st["host_updated_layers"]
                        if st.get("host_updated_layers") else ""))
                     for i, st in enumerate(plan.get("pipeline", []))
                     if st.get("recompute") or st.get("offload_optimizer")
                     or st.get("offload_activations")]
            if modes:
                print("      stages not all on their device: " + ", ".join(modes), flush=True)
            stage_rows = []
            for s in m.get("pipeline_stages", []):
                phase = s.get("busy_seconds", 0) + s.get("bubble_seconds", 0) + s.get(
                    "copy_seconds", 0)
                bubble = s.get("bubble_seconds", 0) / phase if phase else 0
                print("      stage %d layers %2d-%-2d busy %7.1f ms  bubble %5.1f%% (GPipe formula "
                      "%4.1f%%)  copies %5.1f ms (peer %5.1f)  peak %6.1f MiB of %6.1f "
                      "predicted" % (
                          s.get("stage", 0), s.get("first_layer", 0), s.get("last_layer", 0),
                          s.get("busy_seconds", 0) * 1e3, bubble * 100,
                          100.0 * (stages - 1) / (M + stages - 1),
                          s.get("copy_seconds", 0) * 1e3, s.get("peer_copy_seconds", 0) * 1e3,
                          int(s.get("peak_bytes", 0)) / 2**20,
                          int(s.get("predicted_bytes", 0)) / 2**20))
                stage_rows.append(s)
            rows.append({"model": model, "stages": stages, "schedule": schedule,
                         "predicted": pred, "measured": meas, "loss": m["loss"],
                         "stages_stats": stage_rows})
    print("pipelines within 10%% of their predicted step: %d of %d" % (within, total))
    for again in sorted(submitted):
        print("run %d of each pipeline: submitted plan within 10%% of the steps under it: %d of %d"
              % (again + 1, submitted[again][0], submitted[again][1]))
    print("pipelines re-planned by the closed loop whose last plan was within 10%% of the "
          "steps run under it: %d of %d" % (loop_within, loop_total))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def auto_bench(args, server):
    """tandemd choosing the stages (auto_stages) against each candidate run by
    name at the same memory and link cap: what it chose, and whether the
    choice measured fastest."""
    mib, link = args.auto.split(":")
    resources = "resources:\n  accelerator_memory_bytes: %d\n  emulated_link_bytes_per_second: %s\n" % (
        int(float(mib) * 2**20), link)
    placements = [("auto_stages", "  pipeline: {auto_stages: true}\n"),
                  ("one accelerator", ""),
                  ("2 stages", "  pipeline: {stages: 2}\n"),
                  ("4 stages", "  pipeline: {stages: 4}\n")]
    for model in args.models.split(","):
        measured = {}
        for name, placement in placements:
            path = write_job(base_job(model, args.steps, args.threads) +
                             "\nplacement:\n  accelerator: ACCELERATOR_KIND_EMULATED\n" +
                             placement + resources + "precision: PRECISION_FP32\n")
            try:
                job = run(args.tandem, server, path)
            except RuntimeError as e:
                print("%-4s %-16s %s" % (model, name, str(e)[:300]), flush=True)
                continue
            finally:
                os.unlink(path)
            m = job["metrics"]
            stages = len(job.get("plan", {}).get("pipeline", [])) or 1
            measured[name] = m.get("measured_step_seconds", 0)
            print("%-4s %-16s %d stage(s), %-16s predicted %8.1f ms  measured %8.1f ms  loss %.5f" % (
                model, name, stages, job.get("plan", {}).get("strategy", "")[9:].lower(),
                m.get("predicted_step_seconds", 0) * 1e3, measured[name] * 1e3, m["loss"]),
                flush=True)
            if name == "auto_stages":
                note = job.get("plan", {}).get("solver", {}).get("note", "")
                print("     " + note[:note.find(". ") + 1], flush=True)
        named = {k: v for k, v in measured.items() if k != "auto_stages" and v > 0}
        if "auto_stages" in measured and named:
            best = min(named, key=named.get)
            print("%s: auto_stages measured %.1f ms; the fastest asked for by name was %s at "
                  "%.1f ms (x%.2f)" % (model, measured["auto_stages"] * 1e3, best,
                                       named[best] * 1e3, measured["auto_stages"] / named[best]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
