#!/usr/bin/env bash
# Fuzzes what reads untrusted bytes (fuzz/, docs/fuzzing.md): builds the fuzz
# targets with clang, libFuzzer, AddressSanitizer and UBSan (Bazel's
# --config=fuzz, in an output base of its own), then runs each for SECONDS from
# its corpus in the tree, and prints per target the executions per second, the
# coverage (libFuzzer's edge and feature counts) and whether it crashed.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s, every target)
#
# New inputs libFuzzer finds go to a scratch directory, not the tree; a crash
# leaves its input in $TANDEM_FUZZ_ARTIFACTS (default /tmp/tandem-fuzz) and
# makes the script exit 1. Replay one with the binary the script names:
#   ~/.cache/tandem/bazel-fuzz-<8 hex digits>/.../bin/fuzz/TARGET FILE
# or, without libFuzzer: bazel build //fuzz:TARGET && bazel-bin/fuzz/TARGET FILE
# (`bazel run` would replay the whole corpus too: the rule's args come first).
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(job_spec_fuzz datasets_fuzz checkpoint_fuzz job_store_fuzz)
fi
# One output base per checkout (a Bazel output base serves one workspace).
output_base="${TANDEM_FUZZ_OUTPUT_BASE:-$HOME/.cache/tandem/bazel-fuzz-$(pwd | md5sum | cut -c1-8)}"
artifacts="${TANDEM_FUZZ_ARTIFACTS:-/tmp/tandem-fuzz}"
# A second Bazel server; it exits after five idle minutes.
bazel_fuzz=(bazel --output_base="$output_base" --max_idle_secs=300)

labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
echo "fuzz: building ${targets[*]} with clang (libFuzzer, ASan, UBSan)"
# No bazel-* links: they belong to the GCC build's output base.
"${bazel_fuzz[@]}" build --config=fuzz --symlink_prefix=/ "${labels[@]}" || exit 1
bin="$("${bazel_fuzz[@]}" info --config=fuzz bazel-bin 2>/dev/null)"

mkdir -p "$artifacts"
# The targets write their inputs to files; keep those off the disk.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
status=0
summary=()
for t in "${targets[@]}"; do
  corpus="fuzz/corpus/${t%_fuzz}"
  scratch="$(mktemp -d)"
  log="$artifacts/$t.log"
  echo "fuzz: $t for ${seconds}s from $corpus ($(ls "$corpus" | wc -l) inputs)"
  "$bin/fuzz/$t" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -timeout=10 -artifact_prefix="$artifacts/$t-" \
    "$scratch" "$corpus" >"$log" 2>&1
  rc=$?
  execs="$(awk '/stat::number_of_executed_units/ {print $2}' "$log")"
  rate="$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)"
  corpus_size="$(ls "$scratch" | wc -l)"
  if [ "$rc" -ne 0 ]; then
    status=1
    crash="$(grep -m1 -oE "(Test unit written to|artifact_prefix.*) .*" "$log" || true)"
    summary+=("$(printf '%-16s CRASHED (exit %d): %s; log %s' "$t" "$rc" "$crash" "$log")")
    grep -m3 -E "ERROR|runtime error|job_.*_fuzz:|datasets_fuzz:|checkpoint_fuzz:" "$log" >&2 || true
  else
    summary+=("$(printf '%-16s %9s execs %7s exec/s  %-22s %5s new inputs' "$t" "$execs" "$rate" "$cov" "$corpus_size")")
  fi
  rm -rf "$scratch"
done
echo "fuzz: binaries in $bin/fuzz"
echo "fuzz: ${seconds}s per target, $(nproc) cores, $(clang --version | head -1)"
printf '%s\n' "${summary[@]}"
exit "$status"
