#!/usr/bin/env bash
# Every C++ and CUDA source of ours (third_party/ aside) is clang-format clean
# (.clang-format: Google style, 100 columns). `make test` runs it; it prints the
# files that are not and how to fix them, and exits non-zero if any.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format: clang-format is not installed: run tools/install-deps.sh test" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cuh' | grep -v '^third_party/')
else  # an unpacked source tree
  mapfile -t files < <(find . -path ./third_party -prune -o -path './bazel-*' -prune -o \
    -type f \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) \
    -print | sed 's|^\./||' | sort)
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ "${#bad[@]}" -gt 0 ]; then
  echo "format: ${#bad[@]} of ${#files[@]} files are not clang-format clean:"
  printf '  %s\n' "${bad[@]}"
  echo "format: fix with: clang-format -i ${bad[*]}"
  exit 1
fi
echo "format: ${#files[@]} files, all clang-format clean"
