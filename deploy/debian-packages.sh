#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install the Debian 12 packages pbox builds, runs and is tested with. Run as root.
# Usage: deploy/debian-packages.sh [--check]
#   --check: only say which packages are missing (exit 0); nothing is installed.
# deploy/roles/common runs it (with --check under ansible's --check).
set -euo pipefail
check=0
case "${1:-}" in
--check) check=1 ;;
"") ;;
*)
	echo "usage: deploy/debian-packages.sh [--check]" >&2
	exit 64
	;;
esac

packages=(
	# build
	meson ninja-build pkg-config gcc clang-format
	# libraries of the data plane and the control channel
	liburcu-dev libconfig-dev libjansson-dev libisal-dev libsodium-dev zlib1g-dev libsystemd-dev
	# the /metrics endpoint of pboxd and pbox-ctrld
	libmicrohttpd-dev
	# the training demo: BLAS and the dataset
	libopenblas-dev dataset-fashion-mnist
	# kernel-bypass data plane
	dpdk-dev libbpf-dev libxdp-dev iproute2
	# tests; fuzzing (libFuzzer: clang and its runtime)
	libcmocka-dev clang libclang-rt-14-dev
	# perf/netlab: cross traffic
	iperf3
	# nicfw/: BPF skeletons; ctrlplane/: integer programs (GLPK)
	bpftool libglpk-dev
	# DVF encoders: the compressors compared and selectable
	liblz4-dev libzstd-dev libsnappy-dev
	# deploy/ (ansible, lint) and perf/report (plots)
	ansible ansible-lint python3-matplotlib
	# Python package and PyTorch integration (Debian's python3 / torch)
	python3 python3-dev python3-numpy python3-pytest python3-torch python3-torchvision
)

if [ $check = 0 ] && [ "$(id -u)" != 0 ]; then
	echo "deploy/debian-packages.sh: run as root (it installs Debian packages)" >&2
	exit 2
fi
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "deploy/debian-packages.sh: all ${#packages[@]} packages are installed"
	exit 0
fi
if [ $check = 1 ]; then
	echo "deploy/debian-packages.sh: ${#missing[@]} package(s) missing: ${missing[*]}"
	exit 0
fi
echo "deploy/debian-packages.sh: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
