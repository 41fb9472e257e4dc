#!/usr/bin/env bash
# Installs the Debian packages that Tessera's build, tests and benchmarks need, and only those
# that are missing (checked with dpkg-query; apt-get runs only when something is missing).
#
#   bash cmake/install-deps.sh --demo     # compiler, CMake, Ninja: enough for the examples
#   bash cmake/install-deps.sh --test     # + Catch2, DLPack, OpenMPI, OpenBLAS, numpy, torch, torchvision (oracles), ccache, Benchmark
#   bash cmake/install-deps.sh --bench    # + Google Benchmark, and the baselines Eigen and LibTorch
#   bash cmake/install-deps.sh --test --bench   # everything CI needs (.ci/run)
#
# Groups add up; no argument means --demo. The CUDA toolkit is not a Debian package here: it is
# expected at /usr/local/cuda (nvcc), and without it the CUDA build is simply skipped.
# Runs as root, or through sudo when that exists; never asks questions (DEBIAN_FRONTEND).
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

demo_packages=(cmake ninja-build g++)
test_packages=(catch2 libdlpack-dev libopenmpi-dev openmpi-bin python3-numpy python3-torch python3-torchvision python3-sklearn libopenblas-openmp-dev ccache libbenchmark-dev)
bench_packages=(libtorch-dev libeigen3-dev libbenchmark-dev)

# Python test oracles from PyPI (not Debian): `safetensors` (the official reader and writer) for
# the checkpoint tests (tests/io/). Installed with --test (pip, into the Debian python3 that
# tests/CMakeLists.txt uses as TESSERA_ORACLE_PYTHON; the check below imports the package under
# its own name with '-' read as '_').
pip_test_packages=(safetensors)

want=()
want_pip=()
[ $# -eq 0 ] && set -- --demo
for arg in "$@"; do
  case "$arg" in
    --demo) want+=("${demo_packages[@]}") ;;
    --test)
      want+=("${demo_packages[@]}" "${test_packages[@]}")
      if [ ${#pip_test_packages[@]} -gt 0 ]; then
        want+=(python3-pip)
        want_pip+=("${pip_test_packages[@]}")
      fi
      ;;
    --bench) want+=("${demo_packages[@]}" "${bench_packages[@]}") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

# Each package once, in the order first asked for.
declare -A seen=()
packages=()
missing=()
for package in "${want[@]}"; do
  [ -n "${seen[$package]:-}" ] && continue
  seen[$package]=1
  packages+=("$package")
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  if [ "$status" != "install ok installed" ]; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages already installed (${packages[*]})"
else
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "install-deps: missing ${missing[*]}, and this is not root and has no sudo." >&2
    echo "install-deps: install them as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A mirror hiccup should not fail CI: try the update and the install up to three times.
  for attempt in 1 2 3; do
    if "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
       "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -q --no-install-recommends "${missing[@]}"; then
      break
    fi
    if [ "$attempt" -eq 3 ]; then
      echo "install-deps: apt-get failed three times" >&2
      exit 1
    fi
    echo "install-deps: apt-get failed; retrying in 10 s" >&2
    sleep 10
  done
  echo "install-deps: installed ${missing[*]}"
fi

if [ ${#want_pip[@]} -gt 0 ]; then
  oracle_python=/usr/bin/python3
  [ -x "$oracle_python" ] || oracle_python=python3
  for package in "${want_pip[@]}"; do
    if ! "$oracle_python" -c "import ${package//-/_}" >/dev/null 2>&1; then
      echo "install-deps: pip-installing $package for $oracle_python"
      "$oracle_python" -m pip install --quiet --break-system-packages "$package"
    fi
  done
fi
