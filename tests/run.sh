#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# Install, build and run the whole pbox test suite on a Debian 12 machine, as root:
#   1. Debian packages (deploy/debian-packages.sh), hugepages (tests/dpdk/setup.sh);
#   2. format check of every C file against .clang-format;
#   3. a -Werror build and every meson test (unit, integration, dpdk);
#   4. an AddressSanitizer + UndefinedBehaviorSanitizer build and its unit and
#      integration tests;
#   5. fuzzing: a clang build of the libFuzzer harnesses (tests/fuzz), each run for
#      PBOX_FUZZ_SECONDS seconds (default 60) from its corpus; one step per harness;
#   6. the Python tests (pytest) against the first build.
# The last line is "N passed, M failed"; the exit status is non-zero if anything failed.
# Tests that cannot run here print why and count as skipped, not passed.
#
# Usage: tests/run.sh [--quick]   (--quick: skip the sanitizer build and fuzzing)
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
passed=0
failed=0
skipped=0
failures=()

if [ "$(id -u)" != 0 ]; then
	echo "tests/run.sh: run as root: it installs packages, reserves hugepages and creates" \
		"network namespaces" >&2
	exit 2
fi

say() { printf '\n==== %s\n' "$*"; }

# Add meson's results from a testlog.json to the totals.
count_meson() {
	local log=$1 line
	[ -f "$log" ] || { failed=$((failed + 1)); failures+=("$log missing"); return; }
	while IFS=$'\t' read -r result name; do
		case "$result" in
		OK | EXPECTEDFAIL) passed=$((passed + 1)) ;;
		SKIP) skipped=$((skipped + 1)) ;;
		*) failed=$((failed + 1)); failures+=("$name ($result)") ;;
		esac
	done < <(/usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    t = json.loads(l)
    print("%s\t%s" % (t["result"], t["name"]))' "$log")
}

step() { # step NAME COMMAND...: one pass/fail entry for a non-meson step
	local name=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		failures+=("$name")
	fi
}

say "packages"
deploy/debian-packages.sh || { echo "0 passed, 1 failed"; exit 1; }

say "hugepages and DPDK environment"
if [ -x tests/dpdk/setup.sh ]; then
	tests/dpdk/setup.sh || echo "tests/run.sh: DPDK setup failed; DPDK tests will skip"
fi

say "format check (.clang-format)"
format_check() {
	local bad
	bad=$(git ls-files '*.c' '*.h' | xargs clang-format --dry-run 2>&1 | grep -c 'warning:')
	if [ "$bad" != 0 ]; then
		git ls-files '*.c' '*.h' | xargs clang-format --dry-run 2>&1 | grep 'warning:' | head -20
		echo "$bad formatting difference(s): run clang-format -i on the files above"
		return 1
	fi
	echo "every C file is formatted"
}
step "clang-format" format_check

say "build (-Werror) and meson tests"
if meson setup build-ci -Dwerror=true --wipe >/dev/null 2>&1 || meson setup build-ci -Dwerror=true; then
	step "build" ninja -C build-ci
	meson test -C build-ci --print-errorlogs --no-rebuild
	count_meson build-ci/meson-logs/testlog.json
else
	failed=$((failed + 1))
	failures+=("meson setup")
fi

if [ $quick = 0 ]; then
	say "AddressSanitizer + UndefinedBehaviorSanitizer build: unit and integration tests"
	if meson setup build-asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false \
		--wipe >/dev/null 2>&1 ||
		meson setup build-asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false; then
		step "build (sanitizers)" ninja -C build-asan
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
			UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
			meson test -C build-asan --print-errorlogs --no-rebuild --suite unit \
			--suite integration --timeout-multiplier 3
		count_meson build-asan/meson-logs/testlog.json
	else
		failed=$((failed + 1))
		failures+=("meson setup (sanitizers)")
	fi
fi

if [ $quick = 0 ]; then
	say "fuzzing: libFuzzer harnesses, ${PBOX_FUZZ_SECONDS:-60} s each for engine, node, control, half of it for the others (PBOX_FUZZ_SECONDS)"
	fuzz_names=(engine node config control dvf dvf_codec probe jobspec statusmsg ctlplan afxdp_frame shm)
	fuzz_setup() {
		CC=clang meson setup build-fuzz -Dfuzz=enabled -Db_sanitize=address,undefined \
			-Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link "$@"
	}
	if ! command -v clang >/dev/null 2>&1; then
		echo "SKIP: fuzzing: clang is not installed (deploy/debian-packages.sh installs" \
			"clang and libclang-rt-14-dev)"
		skipped=$((skipped + ${#fuzz_names[@]}))
	elif ! { fuzz_setup --wipe >/dev/null 2>&1 || fuzz_setup; }; then
		echo "SKIP: fuzzing: the clang fuzz build cannot be configured (libFuzzer missing?" \
			"Debian: libclang-rt-14-dev); see build-fuzz/meson-logs/meson-log.txt"
		skipped=$((skipped + ${#fuzz_names[@]}))
	elif ! ninja -C build-fuzz "${fuzz_names[@]/#/tests/fuzz/fuzz_}"; then
		failed=$((failed + 1))
		failures+=("build (fuzz)")
	else
		for name in "${fuzz_names[@]}"; do
			secs=${PBOX_FUZZ_SECONDS:-60}
			# The decoders of the data path get the whole budget; the others (small
			# decoders, fast inputs) half of it.
			case $name in
			engine | node | control) ;;
			*) secs=$(((secs + 1) / 2)) ;;
			esac
			step "fuzz_$name" env PBOX_FUZZ_SECONDS="$secs" tests/fuzz/run.sh build-fuzz "$name"
		done
	fi
fi

say "Python tests (pytest)"
if [ -d tests/python ]; then
	junit=build-ci/pytest.xml
	PBOX_BUILD_DIR=$root/build-ci /usr/bin/python3 -m pytest tests/python -q \
		--junitxml="$junit" -p no:cacheprovider
	if [ -f "$junit" ]; then
		read -r t f e s < <(/usr/bin/python3 -c '
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r if r.tag == "testsuite" else r.find("testsuite")
print(s.get("tests"), s.get("failures"), s.get("errors"), s.get("skipped"))' "$junit")
		passed=$((passed + t - f - e - s))
		failed=$((failed + f + e))
		skipped=$((skipped + s))
		[ $((f + e)) = 0 ] || failures+=("pytest: $((f + e)) failure(s)")
	else
		failed=$((failed + 1))
		failures+=("pytest did not run")
	fi
fi

say "summary"
[ $skipped = 0 ] || echo "$skipped skipped (each printed its reason above)"
for f in "${failures[@]}"; do
	echo "FAILED: $f"
done
echo "$passed passed, $failed failed"
[ $failed = 0 ]
