#!/usr/bin/env bash
# scripts/deps.sh: install the Debian packages brigade needs to build and test
# (g++: tests/package compiles the public headers as C++ too; clang with its
# libFuzzer runtime and OpenMP: the fuzzing build, fuzz/ and docs/fuzzing.md;
# iproute2: tests/netns makes hosts of network namespaces; libdnnl2: oneDNN,
# whose sgemm the CPU backend loads when present (optional at run time,
# OpenBLAS otherwise: docs/kernels.md); libdnnl-dev: its header, for the bf16
# GEMM tiles of --precision bf16 (kernels/cpu/cpu_bf16mm.c)),
# only those that are missing. Safe to run again. Needs root (or sudo).
set -euo pipefail
PKGS=(cmake make gcc g++ pkg-config libopenblas-dev libcmocka-dev libucx-dev ucx-utils
      libnuma-dev libjansson-dev openmpi-bin libopenmpi-dev python3 python3-numpy
      clang libclang-rt-14-dev libomp-14-dev iproute2 libdnnl2 libdnnl-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
