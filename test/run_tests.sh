#!/usr/bin/env bash
# Runs Catch2 test binaries and aggregates their results into one closing line
# `N passed, M failed` (test cases), exiting non-zero if anything failed.
#
#   test/run_tests.sh [--filter 'CATCH TAG EXPRESSION'] [--timeout SECONDS] BINARY...
#
# A binary that crashes, hangs past the timeout or prints no Catch2 summary counts as one
# failed test case, and its whole output is shown. Passing binaries print one line each.
set -u
filter=""
timeout_s="${TEST_TIMEOUT:-900}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --filter) filter="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    *) break ;;
  esac
done

total_passed=0
total_failed=0
for bin in "$@"; do
  name=$(basename "$bin")
  args=()
  [[ -n "$filter" ]] && args+=("$filter")
  start=$(date +%s)
  output=$(timeout --kill-after=10 "$timeout_s" "$bin" "${args[@]}" 2>&1)
  rc=$?
  seconds=$(( $(date +%s) - start ))
  passed=""; failed=0
  if [[ "$output" =~ All\ tests\ passed\ \(([0-9]+)\ assertions?\ in\ ([0-9]+)\ test\ cases?\) ]]; then
    passed=${BASH_REMATCH[2]}
  elif [[ "$output" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    passed=${BASH_REMATCH[2]}; failed=${BASH_REMATCH[3]}
  elif [[ "$output" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    passed=0; failed=${BASH_REMATCH[2]}
  fi
  if [[ -z "$passed" || ( $rc -ne 0 && $failed -eq 0 ) ]]; then
    # No summary (crash, abort, timeout) or a non-zero exit with nothing counted as failed.
    passed=${passed:-0}
    failed=$(( failed + 1 ))
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "$name: TIMED OUT after ${timeout_s}s"
  fi
  total_passed=$(( total_passed + passed ))
  total_failed=$(( total_failed + failed ))
  if [[ $failed -gt 0 ]]; then
    echo "---- $name (exit $rc) ----"
    echo "$output"
    echo "---- $name: $passed passed, $failed failed (${seconds}s)"
  else
    echo "$name: $passed passed (${seconds}s)"
  fi
done
echo "$total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]]
