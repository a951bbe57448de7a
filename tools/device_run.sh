#!/usr/bin/env bash
# The GPU machine's side of tools/device_bundle.sh: unpacks the bundle beside
# this script, finds the machine's CUDA libraries and runs one stage.
#
#   bash device-bundle/device_run.sh probe     the GPU, the driver, glibc, the CUDA libraries found
#   bash device-bundle/device_run.sh tests     every CUDA test binary (kernels against the CPU reference, ...)
#   bash device-bundle/device_run.sh bench     bench/gpu/run.py: gpt and cnn x 3 strategies x 25/50/100%, and PyTorch
#   bash device-bundle/device_run.sh profile   tandem profile of gpt and cnn on cpu + cuda:0, with traces
#   bash device-bundle/device_run.sh closed_loop   tandemd runs a 12-layer GPT (whole GPU, and 50% of
#                                              its state under reuse_distance); prints each plan history
#   bash device-bundle/device_run.sh precision  the 12-layer GPT in fp32 and bf16, whole GPU and 50%
#                                              of its state, each against PyTorch
#   bash device-bundle/device_run.sh all       each in turn (not precision)
#
# Results go to $OUT (the device tool's result folder) when set, else ./device-out.
# Extra arguments after `bench` go to bench/gpu/run.py (e.g. --models=gpt --steps=20).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
root=${TANDEM_BUNDLE_DIR:-/tmp/tandem-gpu}
if [[ ! -x $root/bin/tandem || $here/tandem-gpu.tar.xz -nt $root/COMMIT ]]; then
  rm -rf "$root"
  unpack=$(mktemp -d)
  tar -C "$unpack" -xJf "$here/tandem-gpu.tar.xz" || { echo "cannot unpack the bundle"; exit 1; }
  mkdir -p "$(dirname "$root")" && mv "$unpack/tandem" "$root" && rmdir "$unpack"
fi

# The CUDA 13 runtime, cuBLAS, cuDNN 9, CUPTI and NVRTC: the toolkit's
# folders first, then the system's, then pip wheels (PyTorch's nvidia-* packages).
find_dir() {
  local lib=$1 d
  # NCCL: PyTorch's wheel (manylinux, so it runs on our bundled glibc 2.36)
  # rather than the system's, which needs GLIBC_2.38 (seen on the H100 machine
  # of 2026-11-27); its folder goes first in the search path below.
  if [[ $lib == libnccl.so.2 ]]; then
    d=$(find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1 | xargs -r dirname)
    [[ -n $d ]] && { echo "$d"; return 0; }
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64 /usr/local/cuda-13*/lib64 \
           /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [[ -e $d/$lib ]] && { echo "$d"; return 0; }
  done
  find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1 | xargs -r dirname
}
libs=()
missing=()
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcupti.so.13 libnvrtc.so.13 libnccl.so.2; do
  d=$(find_dir "$lib")
  if [[ -n $d ]]; then
    [[ " ${libs[*]-} " == *" $d "* ]] || libs+=("$d")
  else
    missing+=("$lib")
  fi
done
nccl_dir=$(find_dir libnccl.so.2)
if [[ -n $nccl_dir ]]; then
  rest=()
  for d in "${libs[@]}"; do [[ $d == "$nccl_dir" ]] || rest+=("$d"); done
  libs=("$nccl_dir" "${rest[@]}")
fi
TANDEM_CUDA_LIBS=$(IFS=:; echo "${libs[*]-}")
export TANDEM_CUDA_LIBS
py=$(command -v python3 || echo /usr/bin/python3)

probe() {
  echo "== probe"
  echo "bundle commit: $(cat "$root/COMMIT")"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi failed"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "CUDA library folders: ${TANDEM_CUDA_LIBS:-none}"
  (( ${#missing[@]} )) && echo "NOT FOUND: ${missing[*]} (the binaries need CUDA 13 and cuDNN 9)"
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1
  "$root/bin/device_query_test" --gtest_brief=1 2>&1 | tail -5
}

tests() {
  echo "== CUDA tests"
  local failed=0 t
  for t in "$root"/libexec/*_test; do
    t=$(basename "$t")
    echo "-- $t"
    timeout "${TANDEM_TEST_TIMEOUT:-240}" "$root/bin/$t" --gtest_output="xml:$out/$t.xml" > "$out/$t.log" 2>&1
    local rc=$?
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|max error|deviation|differ' "$out/$t.log" | tail -25
    (( rc == 0 )) || { echo "FAILED: $t (exit $rc; log $out/$t.log)"; failed=1; }
  done
  return $failed
}

bench() {
  echo "== hybrid benchmark (bench/gpu/run.py)"
  (cd "$root" && "$py" bench/gpu/run.py --tandem "$root/bin/tandem" --accelerator cuda --torch \
       --python "$py" --json_out "$out/gpu_bench.jsonl" "$@") 2>&1 | tee "$out/gpu_bench.txt"
}

profile() {
  echo "== tandem profile on cpu + cuda:0"
  (cd "$root" && "$py" bench/gpu/run.py --tandem "$root/bin/tandem" --write_specs "$out/specs")
  local m
  for m in gpt cnn; do
    "$root/bin/tandem" profile "$out/specs/$m.json" --trace_out="$out/profile-$m.trace.json" \
      > "$out/profile-$m.txt" 2> "$out/profile-$m.err"
    echo "-- $m: exit $?"; cat "$out/profile-$m.err"; head -60 "$out/profile-$m.txt"
    "$root/bin/tandem" profile "$out/specs/$m.json" --output=json > "$out/profile-$m.profile.json" 2>/dev/null
  done
}

# The 12-layer GPT (85.6 M parameters) in fp32 and bf16 (TANDEM_PRECISIONS:
# also fp16) at 50% of its model state and with the whole GPU, each against
# PyTorch in the same run: the mixed-precision offload (bf16 working copies
# and gradients) against fp32's.
precision() {
  echo "== fp32 and bf16 on cuda:0 (bench/gpu/run.py, 12-layer GPT)"
  local p
  for p in ${TANDEM_PRECISIONS:-fp32 bf16}; do
    (cd "$root" && "$py" bench/gpu/run.py --tandem "$root/bin/tandem" --accelerator cuda --torch \
         --python "$py" --models gpt --fractions "${TANDEM_FRACTIONS:-0.5,all}" --steps 20 \
         --gpt_layers 12 --gpt_heads 12 --gpt_d_model 768 --gpt_context 256 --gpt_batch 16 \
         --torch_seconds 5 --timeout 120 --precision "$p" --json_out "$out/precision-$p.jsonl" "$@") \
      2>&1 | tee "$out/precision-$p.txt"
  done
}

closed_loop() {
  echo "== tandemd's closed loop on cuda:0"
  local state port=/tmp/tandemd-port t id job
  state=$(mktemp -d)
  rm -f "$port"
  setsid "$root/bin/tandemd" --listen=127.0.0.1:0 --port_file="$port" --state_dir="$state" \
    --data_root=/tmp > "$out/tandemd.log" 2>&1 < /dev/null &
  local daemon=$!
  for _ in $(seq 150); do [[ -s $port ]] && break; sleep 0.2; done
  [[ -s $port ]] || { echo "tandemd did not start:"; tail -5 "$out/tandemd.log"; return 1; }
  t=("$root/bin/tandem" --server=127.0.0.1:"$(cat "$port")")
  (cd "$root" && "$py" bench/gpu/run.py --tandem "$root/bin/tandem" --write_specs "$state/specs" \
     --models gpt --gpt_layers 12 --gpt_heads 12 --gpt_d_model 768 --gpt_context 256 --gpt_batch 16)
  "$py" - "$state/specs" <<'PY'
import json, os, sys
d = sys.argv[1]
base = json.load(open(os.path.join(d, "gpt.json")))
for name, strategy, budget in (("whole", "STRATEGY_GPU_ONLY", 0),
                               ("half", "STRATEGY_REUSE_DISTANCE", 686 << 20)):
    s = dict(base, display_name=f"closed-loop-{name}")
    s["training"] = dict(s["training"], steps=60, log_interval_steps=10, eval_interval_steps=60)
    s["placement"] = {"strategy": strategy, "accelerator": "ACCELERATOR_KIND_CUDA"}
    if budget:
        s["resources"] = {"accelerator_memory_bytes": budget}
    json.dump(s, open(os.path.join(d, f"{name}.json"), "w"))
PY
  for job in whole half; do
    "${t[@]}" submit "$state/specs/$job.json" --watch > "$out/closed-loop-$job.txt" 2>&1
    echo "-- $job: exit $?"
  done
  for id in $("${t[@]}" jobs | awk '/^job-/ {print $1}'); do
    "${t[@]}" --output=json status "$id" > "$out/$id.json"
    "$py" - "$out/$id.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(j["spec"].get("display_name"), j["state"], "re-plans:", j.get("metrics", {}).get("replans", 0))
for r in j.get("plan_history", []):
    print(f"  from step {r.get('from_step', 0)}: predicted {float(r.get('predicted_step_seconds', 0)) * 1e3:.2f} ms,"
          f" measured {float(r.get('measured_step_seconds', 0)) * 1e3:.2f} ms; {r.get('replaced_because', 'current')}")
    print(f"    {r.get('cost_source', '')[:160]}")
PY
  done
  kill "$daemon" 2> /dev/null
}

stage=${1:-all}
shift || true
case $stage in
  probe) probe ;;
  tests) tests ;;
  bench) bench "$@" ;;
  profile) profile ;;
  closed_loop) closed_loop ;;
  precision) precision "$@" ;;
  all) probe; tests; bench "$@"; profile; closed_loop ;;
  *) echo "usage: device_run.sh probe|tests|bench|profile|closed_loop|precision|all [bench args]"; exit 2 ;;
esac
