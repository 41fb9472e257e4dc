#!/usr/bin/env bash
# Builds, on the CPU machine, what bench/device_check.sh runs on a lent GPU machine, and packs it
# into build/device/pack.tar.xz (git-ignored; `run` carries it with `carry: ["build/device/pack.tar.xz"]`):
#   - tessera_cuda_tests (every tests/**/*_test.cu) and tessera_cuda_gxx_tests (a g++ unit that
#     trains on CUDA through tessera::compiled, tests/cuda_gxx/) and tessera_io_dlpack_cuda_tests
#     (DLPack exchange of CUDA tensors), from the cuda preset's tree;
#   - cuda_bench (bench/cuda_bench.cu) and nvrtc_cost (bench/nvrtc_cost.cpp), from a Release CUDA
#     tree with the benchmarks on;
#   - the shared libraries they need that the GPU machine lacks (Debian's OpenBLAS, gfortran,
#     quadmath, gomp, Google Benchmark); CUDA's own (cudart, cuBLAS, cuDNN, NCCL) are there.
# Hopper (sm_90) by default: TESSERA_CUDA_ARCHITECTURES=... to change it.
#   bash bench/device_pack.sh            # then: run bench/device_check.sh on the GPU machine
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=${TESSERA_CI_JOBS:-$(nproc)}
arch=${TESSERA_CUDA_ARCHITECTURES:-90}
launchers=()
if command -v ccache >/dev/null 2>&1; then
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

# The preset's optimisation levels, explicitly: CI's cuda stage configures the same tree with
# unoptimised host code (.ci/run), which would stay in its cache.
cmake --preset cuda "${launchers[@]}" -DTESSERA_CUDA_ARCHITECTURES="$arch" \
  -DTESSERA_TEST_OPTIMIZATION=-Og \
  '-DTESSERA_COMPILED_OPTIONS=$<$<COMPILE_LANGUAGE:CUDA>:-O1;-Xcicc=-O1;-Xptxas=-O1>' >/dev/null
cmake --build --preset cuda -j "$jobs" --target tessera_cuda_tests tessera_cuda_gxx_tests \
  tessera_io_dlpack_cuda_tests
cmake -S . -B build/cudabench -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_WITH_CUDA=ON \
  -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_EXAMPLES=OFF -DTESSERA_BUILD_BENCH=ON \
  -DTESSERA_CUDA_ARCHITECTURES="$arch" "${launchers[@]}" >/dev/null
cmake --build build/cudabench -j "$jobs" --target cuda_bench nvrtc_cost

stage=build/device/pack
rm -rf "$stage" build/device/pack.tar.xz
mkdir -p "$stage/bin" "$stage/lib"
cp build/cuda/tests/tessera_cuda_tests build/cuda/tests/tessera_cuda_gxx_tests \
  build/cuda/tests/tessera_io_dlpack_cuda_tests build/cudabench/bench/cuda_bench \
  build/cudabench/bench/nvrtc_cost "$stage/bin/"
# The libraries the binaries load from Debian's packages (the GPU machine has CUDA's own).
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | grep -E 'libopenblas|libgfortran|libquadmath|libgomp|libbenchmark' |
  while read -r library; do cp -L "$library" "$stage/lib/"; done
# The host-time interposer (bench/host_time.c: time inside CUDA, cuDNN and cuBLAS calls).
gcc -O2 -shared -fPIC -o "$stage/lib/host_time.so" bench/host_time.c -ldl
cp bench/cuda_torch_baseline.py bench/device_check.sh "$stage/"
git rev-parse --short HEAD > "$stage/commit"
tar cJf build/device/pack.tar.xz -C build/device pack
ls -l build/device/pack.tar.xz
echo "packed $(cat "$stage/commit"): $(ls "$stage/bin" | tr '\n' ' ')and $(ls "$stage/lib" | tr '\n' ' ')"
