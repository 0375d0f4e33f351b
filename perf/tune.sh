#!/bin/bash
# CPU lists are space-separated words, split on purpose:
# shellcheck disable=SC2086
# SPDX-License-Identifier: BSD-3-Clause
#
# perf/tune.sh: check (and with --apply, set) what pbox's benchmarks and a production
# appliance assume of the host: the CPU governor, hugepages, IRQ affinity away from the
# data-plane CPUs, isolated CPUs, socket buffer limits and kernel busy polling. Every
# setting is printed with its current and recommended value and a status:
#   ok              already as recommended
#   would change    differs; --apply sets it
#   changed         --apply set it
#   cannot: WHY     differs and cannot be changed from here (read-only in a container,
#                   needs the kernel command line and a reboot, refused by the kernel)
#   n/a: WHY        does not exist on this host (no cpufreq in a VM, ...)
# Nothing is lowered that is already above the recommendation (hugepages, buffers).
# deploy/roles/host_tuning runs it for the governor and IRQs (--only governor,irq).
#
# Usage: perf/tune.sh [--apply] [--only LIST] [--dataplane-cpus LIST] [--hugepages N]
#                     [--sock-buf BYTES] [--busy-poll USEC] [--root DIR] [--strict]
#   --only            comma-separated: governor,hugepages,irq,isolation,sockbuf,busypoll
#   --dataplane-cpus  pboxd's data-plane CPUs (default: every online CPU but the first)
#   --hugepages       2 MB pages to have reserved (default 512, as tests/dpdk/setup.sh)
#   --sock-buf        net.core.{r,w}mem_max at least (default 16777216; pboxd asks for
#                     8 MiB per socket)
#   --busy-poll       net.core.busy_poll / busy_read in microseconds (default 50 for a
#                     dedicated appliance; 0 on a machine others share)
#   --root            read and write /proc and /sys below DIR (tests)
#   --strict          exit 1 if anything is not ok after the run
# Exit status: 0 (1 with --strict and something left), 64 bad usage.
set -uo pipefail

apply=0 strict=0 root="" only="governor,hugepages,irq,isolation,sockbuf,busypoll"
dp_arg="" want_huge=512 want_buf=16777216 want_busy=50
usage() {
	sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 64
}
while [ $# -gt 0 ]; do
	case "$1" in
	--apply) apply=1; shift ;;
	--strict) strict=1; shift ;;
	--only) only=${2:?}; shift 2 ;;
	--dataplane-cpus) dp_arg=${2:?}; shift 2 ;;
	--hugepages) want_huge=${2:?}; shift 2 ;;
	--sock-buf) want_buf=${2:?}; shift 2 ;;
	--busy-poll) want_busy=${2:?}; shift 2 ;;
	--root) root=${2:?}; shift 2 ;;
	-h | --help) usage ;;
	*) echo "tune.sh: unknown option '$1'" >&2; usage ;;
	esac
done
for n in "$want_huge" "$want_buf" "$want_busy"; do
	[[ "$n" =~ ^[0-9]+$ ]] || { echo "tune.sh: '$n' is not a number" >&2; exit 64; }
done
for o in ${only//,/ }; do
	case "$o" in
	governor | hugepages | irq | isolation | sockbuf | busypoll) ;;
	*) echo "tune.sh: --only: unknown setting '$o'" >&2; exit 64 ;;
	esac
done
wanted() { [[ ",$only," == *",$1,"* ]]; }

# "0-2,5" -> "0 1 2 5"
expand() {
	local part a b out=()
	for part in ${1//,/ }; do
		if [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]]; then
			a=${BASH_REMATCH[1]} b=${BASH_REMATCH[2]}
			while [ "$a" -le "$b" ]; do out+=("$a"); a=$((a + 1)); done
		elif [[ "$part" =~ ^[0-9]+$ ]]; then
			out+=("$part")
		else
			return 1
		fi
	done
	echo "${out[*]}"
}
# "0 1 2 5" -> "0,1,2,5"
join() { local IFS=,; echo "$*"; }
lst() { if [ -n "$1" ]; then join $1; else echo none; fi; }

online=$(expand "$(cat "$root/sys/devices/system/cpu/online" 2>/dev/null || echo 0)") ||
	online=0
if [ -n "$dp_arg" ]; then
	dp=$(expand "$dp_arg") || { echo "tune.sh: --dataplane-cpus: bad list '$dp_arg'" >&2; exit 64; }
else
	dp=$(echo "$online" | cut -s -d' ' -f2-)
fi
hk=""
for c in $online; do
	[[ " $dp " == *" $c "* ]] || hk+="$c "
done
hk=${hk% }
for c in $dp; do
	[[ " $online " == *" $c "* ]] || {
		echo "tune.sh: data-plane CPU $c is not online (online: $(join $online))" >&2
		exit 64
	}
done

left=0
row() { # row SETTING CURRENT RECOMMENDED STATUS
	printf '%-32s %-20s %-20s %s\n' "$1" "$2" "$3" "$4"
	[ "$4" = ok ] || [ "${4%%:*}" = n/a ] || [ "$4" = changed ] || left=$((left + 1))
}

# Why a write failed, in words an operator can act on.
why() { # why FILE ERRTEXT
	if [[ "$2" == *"Read-only file system"* ]]; then
		echo "$1 is read-only here (a container: set it on the host or through the runtime)"
	elif [[ "$2" == *"Permission denied"* || "$2" == *"Operation not permitted"* ]]; then
		if [ "$(id -u)" = 0 ]; then
			echo "the kernel does not let even root write $1 here"
		else
			echo "permission denied on $1 (run as root)"
		fi
	elif [[ "$2" == *"Input/output error"* ]]; then
		echo "the kernel refuses it (a managed or per-CPU interrupt)"
	else
		echo "${2:-write failed}"
	fi
}

# set_file FILE VALUE: write VALUE into FILE; on failure print why and return 1.
set_file() {
	local err
	if err=$( (printf '%s\n' "$2" >"$1") 2>&1); then
		return 0
	fi
	why "${1#"$root"}" "$err"
	return 1
}

# A sysctl with a minimum (raise only) or an exact value.
sysctl_row() { # sysctl_row NAME WANT min|exact
	local f="$root/proc/sys/${1//.//}" cur ok=0 msg
	if [ ! -r "$f" ]; then
		row "$1" "-" "$2" "n/a: no $1 in this kernel"
		return
	fi
	read -r cur <"$f"
	if [ "$3" = min ]; then [ "$cur" -ge "$2" ] && ok=1; else [ "$cur" = "$2" ] && ok=1; fi
	if [ $ok = 1 ]; then
		row "$1" "$cur" "$([ "$3" = min ] && echo ">= ")$2" ok
	elif [ $apply = 0 ]; then
		row "$1" "$cur" "$2" "would change"
	elif msg=$(set_file "$f" "$2"); then
		row "$1" "$cur" "$2" changed
	else
		row "$1" "$cur" "$2" "cannot: $msg"
	fi
}

echo "perf/tune.sh on $(hostname) ($(date -u '+%Y-%m-%d %H:%M UTC'))$([ -n "$root" ] && echo ", root $root"):" \
	"online CPUs $(lst "$online"), data-plane CPUs $(lst "$dp")," \
	"housekeeping $(lst "$hk"); $([ $apply = 1 ] && echo applying || echo "checking (--apply sets)")"
printf '%-32s %-20s %-20s %s\n' setting current recommended status

if wanted governor; then
	found=0
	for c in $online; do
		f=$root/sys/devices/system/cpu/cpu$c/cpufreq/scaling_governor
		[ -r "$f" ] || continue
		found=1
		read -r cur <"$f"
		if [ "$cur" = performance ]; then
			row "governor cpu$c" "$cur" performance ok
		elif ! grep -qw performance "$root/sys/devices/system/cpu/cpu$c/cpufreq/scaling_available_governors" 2>/dev/null; then
			row "governor cpu$c" "$cur" performance "cannot: the driver has no performance governor"
		elif [ $apply = 0 ]; then
			row "governor cpu$c" "$cur" performance "would change"
		elif msg=$(set_file "$f" performance); then
			row "governor cpu$c" "$cur" performance changed
		else
			row "governor cpu$c" "$cur" performance "cannot: $msg"
		fi
	done
	[ $found = 1 ] || row governor - performance \
		"n/a: no cpufreq here (a VM, or firmware controls the frequency)"
fi

if wanted hugepages; then
	f=$root/proc/sys/vm/nr_hugepages
	if [ ! -r "$f" ]; then
		row "hugepages (2 MB)" - "$want_huge" "n/a: no hugepage support in this kernel"
	else
		read -r cur <"$f"
		if [ "$cur" -ge "$want_huge" ]; then
			row "hugepages (2 MB)" "$cur" ">= $want_huge" ok
		elif [ $apply = 0 ]; then
			row "hugepages (2 MB)" "$cur" "$want_huge" "would change"
		elif msg=$(set_file "$f" "$want_huge"); then
			read -r got <"$f"
			if [ "$got" -ge "$want_huge" ]; then
				row "hugepages (2 MB)" "$cur" "$want_huge" changed
			else
				row "hugepages (2 MB)" "$cur" "$want_huge" \
					"cannot: the kernel found only $got (fragmented memory: reserve them at boot, hugepages=$want_huge)"
			fi
		else
			row "hugepages (2 MB)" "$cur" "$want_huge" "cannot: $msg"
		fi
	fi
	if grep -qs ' hugetlbfs ' "$root/proc/mounts"; then
		row "hugetlbfs mounted" "$(awk '$3 == "hugetlbfs" {print $2; exit}' "$root/proc/mounts")" mounted ok
	elif [ $apply = 1 ] && [ -z "$root" ] && mkdir -p /dev/hugepages &&
		msg=$(mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages 2>&1); then
		row "hugetlbfs mounted" no /dev/hugepages changed
	elif [ $apply = 1 ]; then
		row "hugetlbfs mounted" no /dev/hugepages "cannot: ${msg:-not with --root}"
	else
		row "hugetlbfs mounted" no /dev/hugepages "would change"
	fi
fi

if wanted irq; then
	if [ -z "$dp" ]; then
		row "IRQ affinity" - - "n/a: no data-plane CPUs"
	elif [ -z "$hk" ]; then
		row "IRQ affinity" - - "cannot: every CPU is a data-plane CPU; leave one for IRQs"
	else
		# default_smp_affinity (a hex mask) is what new IRQs get.
		mask=0
		for c in $hk; do mask=$((mask | (1 << c))); done
		want_mask=$(printf '%x' $mask)
		f=$root/proc/irq/default_smp_affinity
		if [ -r "$f" ]; then
			read -r cur <"$f"
			if [ $((16#${cur//,/})) = $mask ]; then
				row "IRQ default affinity" "$cur" "$want_mask" ok
			elif [ $apply = 0 ]; then
				row "IRQ default affinity" "$cur" "$want_mask" "would change"
			elif msg=$(set_file "$f" "$want_mask"); then
				row "IRQ default affinity" "$cur" "$want_mask" changed
			else
				row "IRQ default affinity" "$cur" "$want_mask" "cannot: $msg"
			fi
		fi
		total=0 on_dp=0
		for d in "$root"/proc/irq/[0-9]*; do
			[ -r "$d/smp_affinity_list" ] || continue
			read -r cur <"$d/smp_affinity_list" 2>/dev/null || continue
			total=$((total + 1))
			cpus=$(expand "$cur") || continue
			hit=0
			for c in $cpus; do [[ " $dp " == *" $c "* ]] && hit=1; done
			[ $hit = 1 ] || continue
			on_dp=$((on_dp + 1))
			irq=${d##*/}
			if [ $apply = 0 ]; then
				row "IRQ $irq affinity" "$cur" "$(join $hk)" "would change"
			elif msg=$(set_file "$d/smp_affinity_list" "$(join $hk)"); then
				row "IRQ $irq affinity" "$cur" "$(join $hk)" changed
			else
				row "IRQ $irq affinity" "$cur" "$(join $hk)" "cannot: $msg"
			fi
		done
		if [ $on_dp = 0 ]; then
			row "IRQ affinity" "$total IRQs" "off $(join $dp)" ok
		fi
		if [ -z "$root" ] && pgrep -x irqbalance >/dev/null 2>&1; then
			row irqbalance running "stopped or banned" \
				"cannot: irqbalance moves IRQs back; stop it or set IRQBALANCE_BANNED_CPULIST=$(join $dp)"
		fi
	fi
fi

if wanted isolation; then
	need="isolcpus=managed_irq,domain,$(join $dp) nohz_full=$(join $dp) rcu_nocbs=$(join $dp)"
	iso=$(cat "$root/sys/devices/system/cpu/isolated" 2>/dev/null)
	nohz=$(cat "$root/sys/devices/system/cpu/nohz_full" 2>/dev/null)
	[ "$nohz" = "(null)" ] && nohz=""
	cmdline=$(cat "$root/proc/cmdline" 2>/dev/null)
	rcu=$(echo "$cmdline" | tr ' ' '\n' | sed -n 's/^rcu_nocbs=//p')
	for kind in isolated:"$iso" nohz_full:"$nohz" rcu_nocbs:"$rcu"; do
		name=${kind%%:*} cur=${kind#*:}
		if [ -z "$dp" ]; then
			row "$name CPUs" "${cur:-none}" none ok
		elif [ "$(expand "${cur:-x}" 2>/dev/null)" = "$dp" ]; then
			row "$name CPUs" "$cur" "$(join $dp)" ok
		else
			row "$name CPUs" "${cur:-none}" "$(join $dp)" \
				"cannot: at run time; needs the kernel command line ($need) and a reboot (deploy/: host_tuning, tag kernel_cmdline)"
		fi
	done
fi

if wanted sockbuf; then
	sysctl_row net.core.rmem_max "$want_buf" min
	sysctl_row net.core.wmem_max "$want_buf" min
fi

if wanted busypoll; then
	sysctl_row net.core.busy_poll "$want_busy" exact
	sysctl_row net.core.busy_read "$want_busy" exact
fi

if [ $left = 0 ]; then
	echo "tune.sh: every setting is as recommended"
else
	echo "tune.sh: $left setting(s) not as recommended (see the status column)"
fi
[ $strict = 1 ] && [ $left != 0 ] && exit 1
exit 0
