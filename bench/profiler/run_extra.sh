#!/usr/bin/env bash
# Called by bench/run_all.sh after it built //bench/...: the always-on
# profiler's overhead on mlp, cnn and gpt training steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "== Always-on per-layer timing: overhead on CPU training steps (target <= 2%) =="
bazel-bin/bench/profiler/always_on_overhead
