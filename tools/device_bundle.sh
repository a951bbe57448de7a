#!/usr/bin/env bash
# Packs what a GPU machine without our Debian libraries needs to run the CUDA
# tests and the hybrid benchmark: the test binaries, the tandem CLI, tandemd, every
# shared library they load except the CUDA ones (cudart, cuBLAS, cuDNN, CUPTI,
# the driver: the GPU machine has its own) and our own glibc with its loader,
# so the binaries run whatever the machine's glibc is. Also the benchmark
# drivers, the planner's hardware specs and tools/device_run.sh, the entry point
# on the other side.
#
#   tools/device_bundle.sh [OUT_DIR]      (default: device-bundle/, git-ignored)
#
# Writes OUT_DIR/tandem-gpu.tar.xz (kept under the device tool's 64 MiB carry
# limit) and OUT_DIR/device_run.sh. On the GPU machine:
#
#   bash device-bundle/device_run.sh probe|tests|bench|profile|all
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-device-bundle}
limit=$((64 * 1024 * 1024))

cuda_tests=(allocator_test context_test device_query_test accelerator_factory_test kernels_test pipeline_cuda_test
            blas_test optimizer_test layers_cuda_test cuda_accelerator_test)
targets=(//clients/cli:tandem //server:tandemd //runtime/profile/cupti:cupti_test
         //bench/gpu:conv_precision)
for t in "${cuda_tests[@]}"; do targets+=("//runtime/cuda:$t"); done
# NCCL on one GPU; libnccl (200+ MB) comes from the GPU machine (PyTorch's).
targets+=(//runtime/dist:nccl_communicator_test //runtime/dist:plan_rank_cuda_test)
if [[ -f runtime/profile/cuda_device_test.cc ]]; then targets+=(//runtime/profile:cuda_device_test); fi

bazel build "${targets[@]}"
[[ -x bazel-bin/runtime/cuda/kernels_test ]] || {
  echo "device_bundle: the CUDA tests were not built: Bazel did not find the CUDA toolkit" >&2
  exit 1
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tandem/bin" "$stage/tandem/libexec" "$stage/tandem/lib" "$stage/tandem/bench" \
         "$stage/tandem/planner"
for t in "${targets[@]}"; do
  path=bazel-bin/${t#//}; path=${path/://}
  install -m 0755 "$path" "$stage/tandem/libexec/"
done

# Shared libraries, minus what the GPU machine must provide itself.
skip='^(linux-vdso|libcuda\.|libcudart|libcublas|libcudnn|libcupti|libnvrtc|libnvidia|libnccl)'
for bin in "$stage"/tandem/libexec/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $1, $3} $1 ~ /^\// {print $1, $1}'
done | sort -u | while read -r name path; do
  base=$(basename "$name")
  [[ $base =~ $skip ]] && continue
  cp -L "$path" "$stage/tandem/lib/$base"
done
loader=$(ldd "$stage/tandem/libexec/tandem" | awk '/ld-linux/ {print $1}')
cp -L "$loader" "$stage/tandem/lib/"
loader_name=$(basename "$loader")

# One wrapper per binary: our loader, our libraries first, then the machine's
# CUDA libraries (device_run.sh finds them and exports TANDEM_CUDA_LIBS).
for bin in "$stage"/tandem/libexec/*; do
  name=$(basename "$bin")
  cat > "$stage/tandem/bin/$name" <<EOF
#!/usr/bin/env bash
here=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$here/lib/$loader_name" --library-path "\$here/lib\${TANDEM_CUDA_LIBS:+:\$TANDEM_CUDA_LIBS}" \\
  "\$here/libexec/$name" "\$@"
EOF
  chmod 0755 "$stage/tandem/bin/$name"
done

mkdir -p "$stage/tandem/bench/gpu" "$stage/tandem/bench/cpu_training" "$stage/tandem/planner/hardware"
cp bench/gpu/run.py "$stage/tandem/bench/gpu/"
cp bench/cpu_training/torch_peer.py "$stage/tandem/bench/cpu_training/"
cp planner/hardware/*.textproto "$stage/tandem/planner/hardware/"
cp clients/examples/*.yaml "$stage/tandem/"
git rev-parse HEAD > "$stage/tandem/COMMIT"

mkdir -p "$out"
XZ_OPT=-9e tar -C "$stage" -cJf "$out/tandem-gpu.tar.xz" tandem
cp tools/device_run.sh "$out/device_run.sh"
size=$(stat -c %s "$out/tandem-gpu.tar.xz")
echo "device_bundle: $out/tandem-gpu.tar.xz $((size / 1024)) KiB ($(ls "$stage/tandem/lib" | wc -l) libraries, commit $(cat "$stage/tandem/COMMIT" | cut -c1-12))"
if (( size > limit )); then
  echo "device_bundle: over the 64 MiB carry limit" >&2
  exit 1
fi
