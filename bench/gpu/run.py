#!/usr/bin/python3
"""Hybrid training on an accelerator: gpt and cnn under gpu_only, zero_offload and
reuse_distance with the accelerator's memory capped at 25%, 50% and 100% of the
model state (weights, gradients and two Adam moments), each run through
`tandem train`. Prints samples/s, the plan's predicted step time against the
measured one, the ratio reuse_distance / zero_offload per budget, and (with
--torch) gpu_only against PyTorch on the same GPU in the same run.

On a GPU node:      bench/gpu/run.py --tandem PATH --accelerator cuda --torch
On any machine:     bench/gpu/run.py --tandem PATH --accelerator emulated
The emulated accelerator runs on the host's cores; its figures exercise the
driver and the executor, they are not GPU figures.

Figures are printed, never asserted. Data is synthetic (no dataset files needed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def model_spec(name, args):
    if name == "gpt":
        model = {"gpt": {"n_layer": args.gpt_layers, "n_head": args.gpt_heads,
                         "d_model": args.gpt_d_model, "context": args.gpt_context}}
        data = {"synthetic": {"sample_shape": [args.gpt_context], "num_classes": 256,
                              "tokens": True, "train_samples": 4096, "test_samples": 256}}
        batch = args.gpt_batch
    elif name == "cnn":
        model = {"cnn": {}}
        data = {"synthetic": {"sample_shape": [28, 28, 1], "num_classes": 10,
                              "train_samples": 16384, "test_samples": 512}}
        batch = args.cnn_batch
    else:
        raise SystemExit(f"--models: unknown model {name!r} (gpt, cnn)")
    return {
        "display_name": f"bench-gpu-{name}",
        "model": model,
        "data": data,
        "optimizer": {"kind": "OPTIMIZER_KIND_ADAM", "learning_rate": 1e-3},
        "training": {"batch_size": batch, "steps": args.steps, "seed": 1,
                     "eval_interval_steps": args.steps, "log_interval_steps": args.steps,
                     "checkpoint_disabled": True},
    }, batch


def run_tandem(tandem, argv, spec, timeout):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        proc = subprocess.run([tandem] + argv[:1] + [path] + argv[1:] + ["--output=json"],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        out = None
    err = proc.stderr.strip().splitlines()
    return proc.returncode, out, (err[-1] if err else "")


def model_state_bytes(tandem, spec, hardware):
    """Weights + gradients + optimizer state, from a gpu_only plan with room for all."""
    plan_spec = dict(spec, placement={"strategy": "STRATEGY_GPU_ONLY",
                                      "accelerator": "ACCELERATOR_KIND_CUDA"})
    rc, out, err = run_tandem(tandem, ["plan", f"--hardware={hardware}", "--compare=gpu_only",
                                       "--accelerator_memory=1TiB"], plan_spec, 300)
    if out is None:
        raise SystemExit(f"tandem plan failed (exit {rc}): {err}")
    total = 0
    for layer in out["plan"]["layers"]:
        mem = layer.get("accelerator_memory", {})
        total += sum(int(mem.get(k, 0)) for k in
                     ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"))
    return total


def torch_peer(args, names):
    cmd = [args.python, os.path.join(ROOT, "bench/cpu_training/torch_peer.py"),
           "--device=cuda", f"--models={','.join(names)}", f"--seconds={args.torch_seconds}",
           f"--gpt_layers={args.gpt_layers}", f"--gpt_heads={args.gpt_heads}",
           f"--gpt_d_model={args.gpt_d_model}", f"--gpt_context={args.gpt_context}",
           f"--gpt_batch={args.gpt_batch}", f"--image_batch={args.cnn_batch}",
           f"--precision={args.precision}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results[r["model"]] = r
    if proc.returncode != 0:
        print(f"PyTorch peer failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return results


def Label(fraction):
    return "  all" if fraction == float("inf") else f"{fraction:5.0%}"


def Budget(budget):
    return f"{'whole GPU':>10}" if budget == 0 else f"{budget / 2**20:7.1f}MiB"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tandem", required=True, help="the tandem CLI binary")
    p.add_argument("--accelerator", choices=["cuda", "emulated"], default="cuda")
    p.add_argument("--models", default="gpt,cnn")
    p.add_argument("--strategies", default="gpu_only,zero_offload,reuse_distance")
    p.add_argument("--fractions", default="0.25,0.5,1.0,all",
                   help="accelerator memory as fractions of the model state, over the GPU's "
                        "fixed bytes; 'all' sets no cap (the whole device)")
    p.add_argument("--fixed_mib", type=float, default=33.0,
                   help="the accelerator's own bytes added to every capped budget (CUDA: the "
                        "33 MiB of cuBLAS workspace that tandem train reserves before planning; "
                        "node/placement.cc kCudaFixedBytes)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="the jobs' precision (bf16 / fp16: matrix products on the tensor "
                        "cores, fp32 master state; fp16 with dynamic loss scaling); the PyTorch "
                        "peer runs under autocast with the same type then (fp16: and a "
                        "GradScaler)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--gpt_layers", type=int, default=4)
    p.add_argument("--gpt_heads", type=int, default=4)
    p.add_argument("--gpt_d_model", type=int, default=256)
    p.add_argument("--gpt_context", type=int, default=128)
    p.add_argument("--gpt_batch", type=int, default=16)
    p.add_argument("--cnn_batch", type=int, default=128)
    p.add_argument("--hardware", default=os.path.join(ROOT, "planner/hardware/h100_sxm_node.textproto"),
                   help="HardwareSpec used only to size the model state")
    p.add_argument("--torch", action="store_true", help="also run PyTorch on the GPU (gpu_only peer)")
    p.add_argument("--torch_seconds", type=float, default=10.0)
    p.add_argument("--python", default="python3", help="interpreter with torch (GPU node's)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per training run")
    p.add_argument("--json_out", default="", help="also write every row as JSON lines here")
    p.add_argument("--save_jobs", default="", metavar="DIR",
                   help="also write each finished job (plan, measured timeline) to DIR as JSON")
    p.add_argument("--write_specs", default="", metavar="DIR",
                   help="only write each model's job spec to DIR/MODEL.json (for tandem profile)")
    args = p.parse_args()
    if args.write_specs:
        os.makedirs(args.write_specs, exist_ok=True)
        for name in args.models.split(","):
            with open(os.path.join(args.write_specs, name + ".json"), "w") as f:
                json.dump(model_spec(name, args)[0], f, indent=1)
        return 0

    kind = {"cuda": "ACCELERATOR_KIND_CUDA", "emulated": "ACCELERATOR_KIND_EMULATED"}[args.accelerator]
    names = [m for m in args.models.split(",") if m]
    strategies = [s for s in args.strategies.split(",") if s]
    fractions = [float("inf") if f == "all" else float(f) for f in args.fractions.split(",") if f]
    fixed = int(args.fixed_mib * 2**20) if args.accelerator == "cuda" else 0
    if args.accelerator == "emulated":  # it has no device of its own to fill
        fractions = [f for f in fractions if f != float("inf")]
    rows = []
    json_out = open(args.json_out, "w") if args.json_out else None
    print(f"accelerator: {args.accelerator}, precision: {args.precision}" +
          ("  (emulated: host cores, NOT GPU figures)" if args.accelerator == "emulated" else ""))
    print(f"{'model':5} {'budget':>14} {'strategy':15} {'samples/s':>10} {'pred ms':>9} "
          f"{'meas ms':>9} {'pred/meas':>9} {'peak MiB':>9}  note")
    for name in names:
        base, batch = model_spec(name, args)
        state = model_state_bytes(args.tandem, base, args.hardware)
        for fraction in fractions:
            budget = 0 if fraction == float("inf") else fixed + int(fraction * state)
            for strategy in strategies:
                spec = dict(base)
                # Named either way: PRECISION_AUTO (the default) is bf16 on a
                # GPU of compute capability 8.0+ and a host that computes bf16.
                spec["precision"] = "PRECISION_" + args.precision.upper()
                spec["placement"] = {"strategy": "STRATEGY_" + strategy.upper(), "accelerator": kind}
                if budget:
                    spec["resources"] = {"accelerator_memory_bytes": budget}
                rc, job, err = run_tandem(args.tandem, ["train"], spec, args.timeout)
                row = {"model": name, "precision": args.precision, "fraction": fraction,
                       "budget_bytes": budget,
                       "model_state_bytes": state, "strategy": strategy, "batch": batch}
                if job is not None and job.get("state") == "JOB_STATE_SUCCEEDED":
                    m = job.get("metrics", {})
                    measured = float(m.get("measured_step_seconds", 0))
                    predicted = float(m.get("predicted_step_seconds", 0))
                    row.update(ok=True, samples_per_second=batch / measured if measured else 0.0,
                               mean_samples_per_second=float(m.get("mean_samples_per_second", 0)),
                               predicted_step_seconds=predicted, measured_step_seconds=measured,
                               peak_accelerator_bytes=int(m.get("peak_accelerator_bytes", 0)),
                               micro_batch=job.get("plan", {}).get("micro_batch_size", batch),
                               loss=float(m.get("loss", 0)))
                    note = f"micro-batch {row['micro_batch']}, loss {row['loss']:.4f}"
                    if float(m.get("loss_scale", 0)) > 0:
                        row.update(loss_scale=float(m["loss_scale"]),
                                   skipped_steps=int(m.get("skipped_steps", 0)))
                        note += (f", loss scale {row['loss_scale']:g}, "
                                 f"{row['skipped_steps']} skipped")
                    print(f"{name:5} {Label(fraction)} {Budget(budget)} {strategy:15} "
                          f"{row['samples_per_second']:10.1f} {predicted * 1e3:9.2f} {measured * 1e3:9.2f} "
                          f"{(predicted / measured if measured else 0):9.3f} "
                          f"{row['peak_accelerator_bytes'] / 2**20:9.1f}  {note}", flush=True)
                else:
                    reason = (job or {}).get("reason") or err or f"exit {rc}"
                    row.update(ok=False, reason=reason)
                    print(f"{name:5} {Label(fraction)} {Budget(budget)} {strategy:15} "
                          f"{'-':>10} {'-':>9} {'-':>9} {'-':>9} {'-':>9}  not run: {reason[:160]}",
                          flush=True)
                rows.append(row)
                if args.save_jobs and job is not None:
                    os.makedirs(args.save_jobs, exist_ok=True)
                    with open(os.path.join(args.save_jobs, f"{name}-{Label(fraction).strip()}-"
                                           f"{strategy}.json".replace("%", "pct")), "w") as f:
                        json.dump(job, f)
                if json_out:
                    json_out.write(json.dumps(dict(row, fraction=Label(fraction).strip())) + "\n")
                    json_out.flush()

    print("\nreuse_distance / zero_offload (samples/s ratio; CoTrain reports 1.3x):")
    for name in names:
        for fraction in fractions:
            by = {r["strategy"]: r for r in rows
                  if r["model"] == name and r["fraction"] == fraction and r.get("ok")}
            if "reuse_distance" in by and "zero_offload" in by:
                ratio = by["reuse_distance"]["samples_per_second"] / by["zero_offload"]["samples_per_second"]
                print(f"  {name} at {Label(fraction).strip()}: {ratio:.3f}x")
            else:
                print(f"  {name} at {Label(fraction).strip()}: n/a (a strategy did not run)")

    ok = [r for r in rows if r.get("ok") and r["measured_step_seconds"] > 0]
    if ok:
        errors = [abs(r["predicted_step_seconds"] / r["measured_step_seconds"] - 1) for r in ok]
        within = sum(e <= 0.10 for e in errors)
        print(f"\npredicted vs measured step time: {within} of {len(ok)} runs within 10% "
              f"(largest error {max(errors):.1%})")

    if args.torch:
        if args.accelerator != "cuda":
            print("\n--torch compares with PyTorch on CUDA only; skipped")
        else:
            peer = torch_peer(args, names)
            how = {"bf16": "autocast bf16", "fp16": "autocast fp16 with GradScaler"}.get(
                args.precision, "TF32 matmuls")
            print(f"\ngpu_only vs PyTorch on the same GPU (PyTorch: no memory cap, {how}):")
            for name in names:
                ours = [r for r in rows if r["model"] == name and r["strategy"] == "gpu_only"
                        and r.get("ok")]
                ours = max(ours, key=lambda r: r["fraction"]) if ours else None
                theirs = peer.get(name)
                if ours and theirs:
                    print(f"  {name}: tandem {ours['samples_per_second']:.1f} samples/s, "
                          f"pytorch {theirs['samples_per_second']:.1f}, ratio "
                          f"{ours['samples_per_second'] / theirs['samples_per_second']:.2f}x")
                else:
                    print(f"  {name}: n/a (tandem {'ok' if ours else 'missing'}, "
                          f"pytorch {'ok' if theirs else 'missing'})")
                if json_out and theirs:
                    json_out.write(json.dumps(dict(theirs, strategy="pytorch")) + "\n")
    if json_out:
        json_out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
