#!/usr/bin/env bash
# Installs the Debian packages Tandem needs, and only those that are missing.
# This is the one place that names packages; the Makefile, CI and the container
# files all call it.
#
#   tools/install-deps.sh [build|test|bench|all]   (default: test)
#   tools/install-deps.sh runtime-packages BINARY...
#   tools/install-deps.sh runtime PACKAGES_FILE
#
# build: compile everything. test: build + what the tests run against (real
# Prometheus and promtool, Python gRPC client, Fashion-MNIST, systemd-analyze for
# the unit in deploy/, clang with libFuzzer and libomp for tools/fuzz.sh).
# bench: test + the PyTorch peer.
#
# The container images (deploy/docker/) build with `build`, then ship only the
# binaries and the shared libraries they link. Those packages are not named
# here: `runtime-packages` derives them, in the build stage, from `ldd` and the
# dpkg database, so they are right for whichever distribution the image is based
# on (Debian bookworm for CPU, NVIDIA's Ubuntu-based CUDA images for GPU), and
# `runtime` installs that list in the runtime stage. A library no package owns
# (a toolkit unpacked by hand) is reported on stderr: the runtime base image
# must provide it.
set -euo pipefail

group="${1:-test}"

if [ "$group" = runtime-packages ]; then
  shift
  if [ "$#" -eq 0 ]; then
    echo "usage: $0 runtime-packages BINARY..." >&2
    exit 2
  fi
  if ldd "$@" | grep -q "not found"; then
    echo "install-deps: unresolved libraries:" >&2
    ldd "$@" | grep "not found" >&2
    exit 1
  fi
  mapfile -t libs < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
  # On merged-/usr systems ldd may report /lib/... while dpkg recorded
  # /usr/lib/... or the symlink's target: ask for all three, in one query.
  candidates=()
  for lib in "${libs[@]}"; do
    candidates+=("$lib" "/usr$lib" "$(readlink -f "$lib")")
  done
  declare -A owner=()
  while IFS= read -r line; do
    case "$line" in diversion*) continue ;; esac
    packages="${line%%: /*}"   # "libfoo1:amd64" or "libfoo1, libfoo1-bar"
    package="${packages%%,*}"
    owner["/${line#*: /}"]="${package%%:*}"
  done < <(dpkg-query -S "${candidates[@]}" 2>/dev/null || true)
  for lib in "${libs[@]}"; do
    found=""
    for candidate in "$lib" "/usr$lib" "$(readlink -f "$lib")"; do
      if [ -n "${owner[$candidate]:-}" ]; then
        found="${owner[$candidate]}"
        break
      fi
    done
    if [ -n "$found" ]; then
      echo "$found"
    else
      echo "install-deps: $lib belongs to no package; the runtime base image must provide it" >&2
    fi
  done | sort -u
  exit 0
fi

build_packages=(
  bazel-bootstrap bazel-rules-java g++ make
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libgrpc-dev
  libabsl-dev libgtest-dev libgmock-dev libsqlite3-dev prometheus-cpp-dev
  libyaml-cpp-dev libdnnl-dev zlib1g-dev libssl-dev libtsan2 libgloo-dev
)
test_packages=(
  python3 python3-grpcio python3-protobuf python3-yaml prometheus
  dataset-fashion-mnist vim-runtime ca-certificates openssl procps systemd clang-format
  clang libclang-rt-dev libomp-dev
)
bench_packages=(
  python3-torch libopenblas0-pthread linux-perf
)

case "$group" in
  build) wanted=("${build_packages[@]}") ;;
  test) wanted=("${build_packages[@]}" "${test_packages[@]}") ;;
  bench | all) wanted=("${build_packages[@]}" "${test_packages[@]}" "${bench_packages[@]}") ;;
  runtime)
    if [ "$#" -ne 2 ] || [ ! -r "$2" ]; then
      echo "usage: $0 runtime PACKAGES_FILE (from runtime-packages)" >&2
      exit 2
    fi
    mapfile -t wanted < <(grep -v '^[[:space:]]*$' "$2")
    ;;
  *)
    echo "usage: $0 [build|test|bench|all] | runtime-packages BINARY... | runtime PACKAGES_FILE" >&2
    exit 2
    ;;
esac

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages for '$group' present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
