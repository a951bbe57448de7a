#!/usr/bin/python3
"""bf16 against fp32 accuracy on the CPU engine, in one run: `tandem train` on
clients/examples/fmnist-{mlp,cnn}.yaml (2 epochs) and text-gpt.yaml (1,000
steps), each once with precision PRECISION_FP32 and once with PRECISION_BF16
(placement without an accelerator), everything else the same. Prints the test
accuracies after 2 epochs (target: bf16 within 0.01 of fp32) and the text
GPT's evaluation losses at every evaluation (target: bf16 within 3% of fp32 at
each). Needs a CPU with AMX or AVX512-BF16 (tandem refuses bf16 elsewhere).
Usage:
  /usr/bin/python3 bench/cpu_training/precision_accuracy.py --tandem bazel-bin/clients/cli/tandem
"""
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
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from machine import cpu_model  # noqa: E402

EVAL = re.compile(r"eval step (\d+): loss ([0-9.]+) accuracy ([0-9.]+)")


def job_file(example, precision, steps=None):
    text = open(os.path.join(REPO, "clients", "examples", example)).read()
    text = re.sub(r"^(\s+)epochs: \d+", r"\g<1>epochs: 2", text, flags=re.M)
    if steps is not None:
        text = re.sub(r"^(\s+)steps: \d+", r"\g<1>steps: %d" % steps, text, flags=re.M)
    text = re.sub(r"checkpoint_interval_steps: \d+", "checkpoint_disabled: true", text)
    text = re.sub(r"^placement:.*?(?=^\S|\Z)", "", text, flags=re.S | re.M)
    text += "\nprecision: %s\nplacement: {accelerator: ACCELERATOR_KIND_NONE}\n" % precision
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return f.name


def train(tandem, example, precision, steps=None):
    """[(step, eval loss, eval accuracy)], the final metrics and the job's
    precision reason, from `tandem train`."""
    path = job_file(example, precision, steps)
    start = time.time()
    result = subprocess.run([tandem, "--output=json", "train", path], capture_output=True,
                            text=True)
    os.unlink(path)
    if result.returncode != 0:
        sys.exit("tandem train %s (%s) failed:\n%s" % (example, precision, result.stderr[-3000:]))
    final = json.loads(result.stdout)
    evals = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
             for m in EVAL.finditer(result.stderr)]
    return evals, final.get("metrics", {}), time.time() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--gpt_steps", type=int, default=1000)
    args = parser.parse_args()
    print("cpu: %s" % cpu_model(), flush=True)
    for model in args.models.split(","):
        example = "text-gpt.yaml" if model == "gpt" else "fmnist-%s.yaml" % model
        steps = args.gpt_steps if model == "gpt" else None
        runs = {}
        for precision in ("PRECISION_FP32", "PRECISION_BF16"):
            evals, metrics, seconds = train(args.tandem, example, precision, steps)
            runs[precision] = evals
            print("%s %s: %d evaluations, %.0f s, %.1f samples/s" % (
                model, precision, len(evals), seconds, metrics.get("mean_samples_per_second", 0)),
                flush=True)
        fp32, bf16 = runs["PRECISION_FP32"], runs["PRECISION_BF16"]
        if model == "gpt":
            worst = 0.0
            for (step, a, _), (_, b, _) in zip(fp32, bf16):
                worst = max(worst, abs(b - a) / a)
                print("  step %5d eval loss fp32 %.4f bf16 %.4f (%+.2f%%)" % (
                    step, a, b, 100 * (b - a) / a))
            ok = len(fp32) == len(bf16) and len(fp32) > 0 and worst <= 0.03
            print("gpt: largest eval-loss difference %.2f%% [target within 3%% at each "
                  "evaluation: %s]" % (100 * worst, "met" if ok else "NOT met"), flush=True)
        else:
            a, b = fp32[-1][2], bf16[-1][2]
            print("%s, 2 epochs: accuracy fp32 %.4f bf16 %.4f difference %+.4f [target within "
                  "0.01: %s]" % (model, a, b, b - a, "met" if abs(b - a) <= 0.01 else "NOT met"),
                  flush=True)


if __name__ == "__main__":
    main()
