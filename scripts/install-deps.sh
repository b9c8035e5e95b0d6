#!/bin/bash
# Installs what building and testing GCR needs, from Debian's packages and PyPI
# only: toolchain, libraries, test tools (the real node's containerd, runc, CNI plugins,
# iptables and mmdebstrap for its images: tests/k8s/node/README.md), and the CUDA 13.0 headers (headers only:
# libcuda is opened at run time, never linked) and the HIP headers (libamdhip64-dev;
# libamdhip64 is likewise opened at run time).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential autoconf automake libtool pkg-config
      libjansson-dev libyaml-dev libcurl4-openssl-dev libmicrohttpd-dev libgnutls28-dev
      clang-14 libclang-rt-14-dev valgrind python3 unzip
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
      libamdhip64-dev
      containerd runc containernetworking-plugins iptables conntrack mmdebstrap
      openssl curl iproute2)
missing=()
for p in "${pkgs[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: need root to install: ${missing[*]}" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CUDA headers: a system toolkit wins; else the nvidia-cuda-runtime wheel,
# unpacked (not installed) into .cache/cuda where configure looks.
if [ ! -f /usr/local/cuda/include/cuda.h ] && [ ! -f .cache/cuda/nvidia/cu13/include/cuda.h ]; then
	mkdir -p .cache/cuda
	python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/cuda/wheel \
		'nvidia-cuda-runtime==13.0.*'
	unzip -qo .cache/cuda/wheel/nvidia_cuda_runtime-*.whl 'nvidia/cu13/include/*' -d .cache/cuda
fi
# NCCL headers, to check the interface the shim declares itself against the NCCL the GPU
# machines' PyTorch uses (tests/unit/test_nccl_abi.c): the wheel is unpacked for its include/ only.
if [ ! -f .cache/nccl/nvidia/nccl/include/nccl.h ]; then
	mkdir -p .cache/nccl
	python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/nccl/wheel 'nvidia-nccl-cu13==2.28.9' &&
		unzip -qo .cache/nccl/wheel/nvidia_nccl_cu13-*.whl 'nvidia/nccl/include/*' -d .cache/nccl &&
		rm -rf .cache/nccl/wheel ||
		echo "install-deps: no NCCL headers (tests/unit/test_nccl_abi will not be built)" >&2
fi
echo "install-deps: ok"
