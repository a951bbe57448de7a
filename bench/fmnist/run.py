#!/usr/bin/python3
"""Fashion-MNIST accuracy: Tandem (tandem train on clients/examples/fmnist-*.yaml)
against PyTorch on the same recipe, in one run, plus Tandem's per-epoch curve over
--curve_epochs. Targets: after 2 epochs mlp >= 0.85 and cnn >= 0.88, within 0.01 of
PyTorch; after 10 epochs mlp >= 0.88 and cnn >= 0.91."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
EVAL = re.compile(r"eval step (\d+): loss ([0-9.]+) accuracy ([0-9.]+)")


def tandem_curve(tandem, model, epochs):
    """Per-epoch test accuracies of `tandem train` on the example file, `epochs` long."""
    example = open(os.path.join(REPO, "clients", "examples", "fmnist-%s.yaml" % model)).read()
    job = re.sub(r"epochs: \d+", "epochs: %d" % epochs, example)
    job = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", job)
    # fp32 like its peer: auto would be bf16 on a CPU that computes it natively.
    job += "\nprecision: PRECISION_FP32\n"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(job)
    result = subprocess.run([tandem, "--output=json", "train", f.name], capture_output=True,
                            text=True, check=True)
    os.unlink(f.name)
    accs = [float(m.group(3)) for m in EVAL.finditer(result.stderr)]
    final = json.loads(result.stdout)
    return accs, final["metrics"]


def torch_curve(model, epochs):
    out = subprocess.run([sys.executable, os.path.join(HERE, "torch_fmnist.py"), "--model", model,
                          "--epochs", str(epochs)], capture_output=True, text=True, check=True)
    return [json.loads(l)["accuracy"] for l in out.stdout.splitlines()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--curve_epochs", type=int, default=10)
    args = parser.parse_args()
    targets2 = {"mlp": 0.85, "cnn": 0.88}
    targets10 = {"mlp": 0.88, "cnn": 0.91}
    for model in args.models.split(","):
        ours, metrics = tandem_curve(args.tandem, model, 2)
        theirs = torch_curve(model, 2)
        a, b = ours[-1], theirs[-1]
        print("%s, 2 epochs: tandem %.4f (%.0f samples/s)  pytorch %.4f  difference %+.4f  "
              "[target >= %.2f: %s; within 0.01: %s]" % (
                  model, a, metrics.get("mean_samples_per_second", 0), b, a - b, targets2[model],
                  "met" if a >= targets2[model] else "NOT met",
                  "met" if abs(a - b) <= 0.01 else "NOT met"), flush=True)
        if args.curve_epochs > 0:
            curve, _ = tandem_curve(args.tandem, model, args.curve_epochs)
            print("%s, tandem curve over %d epochs: %s  [target >= %.2f at the end: %s]" % (
                model, args.curve_epochs, " ".join("%.4f" % c for c in curve), targets10[model],
                "met" if curve[-1] >= targets10[model] else "NOT met"), flush=True)


if __name__ == "__main__":
    main()
