#!/usr/bin/env bash
# Installs the Debian packages Tandem needs, and only those that are missing.
# This is the one place that names packages; the Makefile, CI and the container
# files all call it.
#
#   tools/install-deps.sh [build|test|bench|all]   (default: test)
#
# build: compile everything. test: build + what the tests run against (real
# Prometheus, Python gRPC client, Fashion-MNIST). bench: test + the PyTorch peer.
set -euo pipefail

group="${1:-test}"

build_packages=(
  bazel-bootstrap bazel-rules-java g++ make
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libgrpc-dev
  libabsl-dev libgtest-dev libgmock-dev libsqlite3-dev libcpp-httplib-dev
  libyaml-cpp-dev libdnnl-dev zlib1g-dev libssl-dev libtsan2
)
test_packages=(
  python3 python3-grpcio python3-protobuf python3-yaml prometheus
  dataset-fashion-mnist vim-runtime ca-certificates procps
)
bench_packages=(
  python3-torch libopenblas0-pthread linux-perf
)

case "$group" in
  build) wanted=("${build_packages[@]}") ;;
  test) wanted=("${build_packages[@]}" "${test_packages[@]}") ;;
  bench | all) wanted=("${build_packages[@]}" "${test_packages[@]}" "${bench_packages[@]}") ;;
  *)
    echo "usage: $0 [build|test|bench|all]" >&2
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
