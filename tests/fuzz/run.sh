#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# Run the libFuzzer harnesses of a fuzz build for a bounded time each.
#
#   tests/fuzz/run.sh BUILD_DIR [NAME...]      (NAME: engine node config control jobspec; default all)
#
# BUILD_DIR is configured as README "Fuzzing" says (clang, -Dfuzz=enabled, sanitizers).
# Each harness starts from its checked-in corpus (tests/fuzz/corpus/NAME, read only: new
# inputs go to a temporary directory) with its dictionary, for PBOX_FUZZ_SECONDS seconds
# (default 60). A crash, a sanitizer report (UBSan included: halt_on_error), a leak, an
# input slower than PBOX_FUZZ_TIMEOUT seconds (default 10) or more than 2 GB of memory
# fails the harness; the input that did it is kept in PBOX_FUZZ_ARTIFACTS (default
# BUILD_DIR/fuzz-artifacts) to add to the corpus. libFuzzer's final statistics give the
# executions, executions per second and coverage printed per harness.
# Exit status: the number of harnesses that failed (0: all passed).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [NAME...]}
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(engine node config control jobspec)
secs=${PBOX_FUZZ_SECONDS:-60}
per_input=${PBOX_FUZZ_TIMEOUT:-10}
artifacts=${PBOX_FUZZ_ARTIFACTS:-$build/fuzz-artifacts}
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/fuzz/lsan.supp}

failed=0
for name in "${names[@]}"; do
	bin=$build/tests/fuzz/fuzz_$name
	corpus=$root/tests/fuzz/corpus/$name
	log=$work/$name.log
	args=(-max_total_time="$secs" -timeout="$per_input" -rss_limit_mb=2048
		-print_final_stats=1 -artifact_prefix="$artifacts/$name-")
	[ -f "$root/tests/fuzz/$name.dict" ] && args+=(-dict="$root/tests/fuzz/$name.dict")
	if [ ! -x "$bin" ]; then
		echo "fuzz_$name: FAILED: $bin is not built"
		failed=$((failed + 1))
		continue
	fi
	mkdir -p "$work/$name"
	echo "fuzz_$name: ${secs} s from $(find "$corpus" -type f | wc -l) seed(s) in" \
		"tests/fuzz/corpus/$name"
	"$bin" "${args[@]}" "$work/$name" "$corpus" >"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	cov=$(grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*' "$log" | tail -1)
	summary="${execs:-?} executions, ${rate:-?} exec/s, ${cov:-no coverage line}"
	if [ $rc = 0 ]; then
		echo "fuzz_$name: passed: $summary"
	else
		failed=$((failed + 1))
		# The report: libFuzzer's and the sanitizer's lines, and where the input is.
		grep -E 'ERROR|invariant failed|runtime error|SUMMARY|Test unit written|^    #[0-9]' \
			"$log" | head -40
		echo "fuzz_$name: FAILED (exit $rc): $summary; full log:"
		echo "  $artifacts/$name.log"
		cp "$log" "$artifacts/$name.log"
	fi
done
exit $failed
