#!/usr/bin/env bash
# Every benchmark, each against its peer measured in the same run (`make bench`).
# Benchmarks print figures and ratios; they never fail on a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //bench/... //clients/cli:tandem
py=/usr/bin/python3

echo "== CPU training throughput: Tandem vs PyTorch (2 threads) =="
$py bench/cpu_training/run.py --tandem bazel-bin/bench/cpu_training/train_throughput

echo "== CPU Adam, 100M parameters: Tandem vs STREAM triad and torch.optim.Adam =="
$py bench/cpu_adam/run.py --tandem bazel-bin/bench/cpu_adam/adam_bench

echo "== Fashion-MNIST accuracy: Tandem vs PyTorch, and Tandem's 10-epoch curve =="
$py bench/fmnist/run.py --tandem bazel-bin/clients/cli/tandem

echo "== Update rules on Fashion-MNIST: each next to synchronous training =="
$py bench/updates/run.py --tandem bazel-bin/clients/cli/tandem

echo "== Pipelines on emulated accelerators: each next to one device =="
bazel build //server:tandemd
$py bench/pipeline/run.py --tandemd bazel-bin/server/tandemd --tandem bazel-bin/clients/cli/tandem
echo "== Pipeline stages offloading to the host: copies and host updates beside compute vs waited for =="
bazel-bin/bench/pipeline/overlap_bench --offload=optimizer --stages=2 --link_gbps=0.5
bazel-bin/bench/pipeline/overlap_bench --offload=activations --schedule=gpipe --stages=2 \
  --micro_batches=8 --link_gbps=0.5
echo "== PipeDream against synchronous pipelines on Fashion-MNIST =="
$py bench/pipeline/accuracy.py --tandem bazel-bin/clients/cli/tandem

echo "== Scale-out on loopback: Gloo all-reduce vs memcpy; 1, 2 and 4 data-parallel ranks =="
bazel-bin/bench/dist/dist_bench
echo "== Data parallelism on Fashion-MNIST: 1, 2 and 4 ranks on 4 tandemd daemons =="
$py bench/dist/fmnist.py --tandemd bazel-bin/server/tandemd --tandem bazel-bin/clients/cli/tandem

for extra in bench/*/run_extra.sh; do
  [ -x "$extra" ] && "$extra"
done

echo "== SubmitJob latency on loopback (target p99 <= 5 ms) =="
$py bench/server/submit_latency.py --tandemd bazel-bin/server/tandemd

echo "== /metrics scrape time, 50 finished and 5 running jobs =="
bazel build //server:tandemd //proto:tandem_py_proto
$py bench/server/scrape_time.py --tandemd bazel-bin/server/tandemd
