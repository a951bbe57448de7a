#!/usr/bin/env python3
"""Closed-loop planning on the emulated accelerator: predicted against measured
step time before and after tandemd re-plans, for text-gpt, fmnist-cnn and
fmnist-resnet at 25, 50 and 100% of their model state.

Starts its own tandemd (a temporary state directory, so no cached layer
profile), submits each job under reuse_distance with the accelerator's memory
at the fraction of the model state (weights, gradients, Adam's two moments),
and reads the job's plan history when it ends: the first plan's prediction
(the analytic profile on the node profile's rates) and its measured step
(median of the first checked window), then the last plan's prediction (from
measured spans) and its measured step. The peer is the plan's own prediction;
the target is |measured / predicted - 1| <= 10% after re-planning. Never
asserts timings. With --throttle (bytes/s) the emulated link runs slower than
the planner is told (tandemd's --emulated_link_throttle).

The emulated accelerator computes on the host's cores: nothing here is a GPU
figure.

  /usr/bin/python3 bench/planner/closed_loop.py --tandemd bazel-bin/server/tandemd \\
      --tandem bazel-bin/clients/cli/tandem
"""
import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench/common"))
import machine  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_example(name):
    out = subprocess.run([sys.executable, "-c", (
        "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"),
        os.path.join(ROOT, "clients/examples", name + ".yaml")],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def spec_of(name, steps):
    spec = load_example({"text-gpt": "text-gpt-emulated"}.get(name, name))
    spec["display_name"] = name
    training = spec["training"]
    for key in ("epochs", "steps", "eval_interval_steps", "checkpoint_interval_steps"):
        training.pop(key, None)
    training.update(steps=steps, log_interval_steps=1, checkpoint_disabled=True)
    spec.setdefault("resources", {}).pop("accelerator_memory_bytes", None)
    # fp32, as in earlier runs: auto would be bf16 on a CPU that computes it
    # natively, whose plans are predicted from a rate its layers do not reach.
    spec["precision"] = "PRECISION_FP32"
    return spec


def tandem(args, server, argv, spec=None, timeout=600):
    path = None
    if spec is not None:
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        argv = argv + [path]
    try:
        proc = subprocess.run([args.tandem, f"--server={server}", "--output=json"] + argv,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        if path:
            os.unlink(path)
    out = None
    if proc.stdout.strip():
        try:
            out = json.loads(proc.stdout)
        except json.JSONDecodeError:
            out = None
    return proc.returncode, out, proc.stderr.strip()


def model_state_bytes(args, server, spec):
    probe = dict(spec, placement={"strategy": "STRATEGY_GPU_ONLY",
                                  "accelerator": "ACCELERATOR_KIND_EMULATED"})
    rc, out, err = tandem(args, server, ["plan", "--compare=gpu_only",
                                         "--accelerator_memory=1TiB"], probe)
    if out is None:
        raise SystemExit(f"tandem plan failed (exit {rc}): {err}")
    return sum(int(layer.get("accelerator_memory", {}).get(k, 0))
               for layer in out["plan"]["layers"]
               for k in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"))


def min_budget_bytes(args, server, spec):
    """The smallest accelerator memory the strategy's plan runs in (0 if unknown)."""
    rc, out, err = tandem(args, server, ["plan", f"--compare={args.strategy}",
                                         "--accelerator_memory=1B"], spec)
    if out is None:
        return 0
    return int(out["plan"].get("min_accelerator_memory_bytes", 0))


def run_job(args, server, spec):
    rc, out, err = tandem(args, server, ["submit"], spec)
    if out is None:
        return None, err.splitlines()[-1] if err else f"exit {rc}"
    job_id = out["id"]
    while True:
        rc, job, err = tandem(args, server, ["status", job_id])
        if job and job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                    "JOB_STATE_CANCELLED"):
            return job, job.get("reason", "")
        time.sleep(1)


def placement_of(record):
    plan = record.get("plan", {})
    layers = plan.get("layers", [])
    host_updates = sum(1 for l in layers if l.get("update") == "PLACEMENT_HOST")
    streamed = sum(1 for l in layers if l.get("parameter_home") == "PARAMETER_HOME_HOST_STREAMED")
    state = sum(1 for l in layers if l.get("stream_optimizer_state"))
    strategy = plan.get("strategy", "?").replace("STRATEGY_", "").lower()
    return (f"{strategy} mb{plan.get('micro_batch_size', 0)} "
            f"upd@host {host_updates} streamed {streamed}" + (f" state {state}" if state else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tandemd", default=os.path.join(ROOT, "bazel-bin/server/tandemd"))
    p.add_argument("--tandem", default=os.path.join(ROOT, "bazel-bin/clients/cli/tandem"))
    p.add_argument("--models", default="text-gpt,fmnist-cnn,fmnist-resnet")
    p.add_argument("--fractions", default="0.25,0.5,1.0")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--strategy", default="reuse_distance")
    p.add_argument("--throttle", type=float, default=0,
                   help="tandemd --emulated_link_throttle, bytes per second (0 = none)")
    p.add_argument("--keep_cache", action="store_true",
                   help="plan later jobs of a model from the layer profile the earlier measured")
    p.add_argument("--json_out", default="")
    args = p.parse_args()

    print("accelerator: emulated (host cores, NOT GPU figures)"
          + (f"; link throttled to {args.throttle / 1e6:.0f} MB/s, the planner not told"
             if args.throttle else ""))
    state_dir = tempfile.mkdtemp(prefix="tandem-closed-loop-")
    port, metrics_port = free_port(), free_port()
    server = f"127.0.0.1:{port}"
    log = open(os.path.join(state_dir, "tandemd.log"), "w")
    daemon = subprocess.Popen([args.tandemd, f"--state_dir={state_dir}/state",
                               f"--listen={server}", f"--metrics_listen=127.0.0.1:{metrics_port}",
                               "--data_root=/usr/share", "--max_running_jobs=1",
                               f"--emulated_link_throttle={args.throttle}"],
                              stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        for _ in range(600):
            rc, node, _ = tandem(args, server, ["node"])
            if rc == 0:
                break
            time.sleep(0.1)
        cpu = node["devices"][0] if node else {}
        versions = cpu.get("versions", {})
        print(f"cpu: {machine.cpu_model()} ({cpu.get('threads', '?')} threads); oneDNN "
              f"{versions.get('onednn', '?')} using {versions.get('onednn_isa', '?')}")
        print("budget = the smallest the strategy's plan runs in + frac x model state")
        print(f"{'model':13} {'frac':>5} {'budget MiB':>10}  {'first plan':34} {'pred ms':>8} "
              f"{'meas ms':>8} {'err':>7}  {'last plan':34} {'pred ms':>8} {'meas ms':>8} "
              f"{'err':>7} replans")
        for name in [m for m in args.models.split(",") if m]:
            base = spec_of(name, args.steps)
            state = model_state_bytes(args, server, base)
            fractions = [float(f) for f in args.fractions.split(",") if f]
            for fraction in fractions:
                spec = json.loads(json.dumps(base))
                spec["placement"] = {"strategy": "STRATEGY_" + args.strategy.upper(),
                                     "accelerator": "ACCELERATOR_KIND_EMULATED"}
                if fraction == fractions[0]:
                    least = min_budget_bytes(args, server, spec)
                budget = least + int(fraction * state)
                spec["resources"]["accelerator_memory_bytes"] = budget
                if not args.keep_cache:  # each "before" from the analytic profile
                    shutil.rmtree(os.path.join(state_dir, "state", "layer_profiles"),
                                  ignore_errors=True)
                job, why = run_job(args, server, spec)
                head = f"{name:13} {fraction:5.0%} {budget / 2**20:10.1f}"
                if job is None or job["state"] != "JOB_STATE_SUCCEEDED":
                    print(f"{head}  not run: {why}")
                    rows.append({"model": name, "fraction": fraction, "ok": False, "why": why})
                    continue
                history = job.get("plan_history", [])
                first, last = history[0], history[-1]
                def cells(r):
                    pred = r.get("predicted_step_seconds", 0) * 1e3
                    meas = r.get("measured_step_seconds", 0) * 1e3
                    err = f"{(meas / pred - 1) * 100:+6.1f}%" if pred and meas else "     -"
                    return f"{placement_of(r):34} {pred:8.1f} {meas:8.1f} {err:>7}"
                source = ("cached layer profile" if "measured here" in first.get("cost_source", "")
                          else "analytic")
                print(f"{head}  {cells(first)}  {cells(last)} {len(history) - 1:7d}  "
                      f"first planned from: {source}")
                rows.append({"model": name, "fraction": fraction, "ok": True,
                             "budget_bytes": budget, "model_state_bytes": state,
                             "history": [{k: v for k, v in r.items() if k != "plan"}
                                         for r in history],
                             "placements": [placement_of(r) for r in history]})
                sys.stdout.flush()
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    ok = [r for r in rows if r["ok"]]
    within = [r for r in ok if r["history"][-1].get("measured_step_seconds")
              and abs(r["history"][-1]["measured_step_seconds"]
                      / r["history"][-1]["predicted_step_seconds"] - 1) <= 0.10]
    print(f"after re-planning, within 10%: {len(within)} of {len(ok)} runs")
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
