#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Prepare a host (as root) for the DPDK tests and benchmarks: reserve 2 MB hugepages and
# mount hugetlbfs. Idempotent: run it as often as you like. Namespaces, veth pairs and
# processes are created and removed by the tests themselves.
#
#   PBOX_HUGEPAGES=N   2 MB pages to have in total (default 512, i.e. 1 GiB)
set -eu

want=${PBOX_HUGEPAGES:-512}
nr=/proc/sys/vm/nr_hugepages

if [ "$(id -u)" != 0 ]; then
	echo "setup.sh: must run as root (hugepages and mounts)" >&2
	exit 1
fi
have=$(cat "$nr")
if [ "$have" -lt "$want" ]; then
	echo "$want" > "$nr"
	have=$(cat "$nr")
fi
if [ "$have" -lt "$want" ]; then
	echo "setup.sh: only $have of $want hugepages could be reserved (memory fragmented?)" >&2
fi
if ! grep -qs ' hugetlbfs ' /proc/mounts; then
	mkdir -p /dev/hugepages
	mount -t hugetlbfs nodev /dev/hugepages
fi
# BPF maps of the AF_XDP PMD count against the locked-memory limit on older kernels.
ulimit -l unlimited 2>/dev/null || true
echo "setup.sh: $(cat "$nr") hugepages of 2 MB, hugetlbfs at $(grep ' hugetlbfs ' /proc/mounts | cut -d' ' -f2 | head -1)"
