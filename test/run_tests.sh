#!/usr/bin/env bash
# Runs Catch2 test binaries, each under every schedule given, and aggregates their results into
# one closing line `N passed, M failed` (test cases), exiting non-zero if anything failed.
#
#   test/run_tests.sh [--filter 'CATCH TAG EXPRESSION'] [--timeout SECONDS]
#                     [--schedule 'LABEL:VAR=VALUE,VAR=VALUE']... BINARY...
#
# A schedule is a label and the environment variables it sets (host/schedule.h: thread and block
# orders, seed; host/stream.h: deferred streams); without --schedule each binary runs once in the
# current environment. A binary that crashes, hangs past the timeout or prints no Catch2 summary
# counts as one failed test case, and its whole output is shown, with the variables to reproduce
# it. Passing runs print one line each. Before the closing line it lists the ten slowest runs
# (binary, ranks and schedule, seconds), so a suite that grows is seen the day it does.
#
# A binary written `LABEL@PATH` runs only under the schedule labelled LABEL (a suite whose cost
# is whole programs, where one schedule is what a budget affords).
#
# A binary written `mpi:N:PATH` is a multi-rank suite (test/catch_mpi_main.cpp): it runs as
# `mpirun -np N` on this machine (oversubscribed, allowed as root, ranks yielding when idle), each
# rank with one host worker and one OpenBLAS thread and the schedule's variables, under a timeout
# of MPI_TEST_TIMEOUT seconds (default 120); rank 0 prints the job's summary.
set -u
filter=""
timeout_s="${TEST_TIMEOUT:-900}"
mpi_timeout_s="${MPI_TEST_TIMEOUT:-120}"
schedules=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --filter) filter="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --schedule) schedules+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
[[ ${#schedules[@]} -eq 0 ]] && schedules=(":")

total_passed=0
total_failed=0
timings=()  # "SECONDS<TAB>NAME" of every run, for the slowest-ten list
for spec in "$@"; do
ranks=0
only=""
if [[ "$spec" =~ ^([^@/]+)@(.+)$ ]]; then
  only=${BASH_REMATCH[1]}
  spec=${BASH_REMATCH[2]}
fi
bin="$spec"
if [[ "$spec" =~ ^mpi:([0-9]+):(.+)$ ]]; then
  ranks=${BASH_REMATCH[1]}
  bin=${BASH_REMATCH[2]}
fi
for schedule in "${schedules[@]}"; do
  label="${schedule%%:*}"
  vars="${schedule#*:}"
  [[ -n "$only" && "$label" != "$only" ]] && continue
  env_args=()
  [[ -n "$vars" ]] && IFS=',' read -r -a env_args <<< "$vars"
  name=$(basename "$bin")
  [[ $ranks -gt 0 ]] && name="$name -np $ranks"
  [[ -n "$label" ]] && name="$name [$label]"
  args=()
  [[ -n "$filter" ]] && args+=("$filter")
  launcher=()
  limit="$timeout_s"
  if [[ $ranks -gt 0 ]]; then
    env_args=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 POLEVAULT_HOST_WORKERS=1 OPENBLAS_NUM_THREADS=1
              "${env_args[@]}")
    launcher=(mpirun -np "$ranks" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
    for v in "${env_args[@]}"; do launcher+=(-x "${v%%=*}"); done
    (( mpi_timeout_s < limit )) && limit="$mpi_timeout_s"
  fi
  start=$(date +%s)
  output=$(env "${env_args[@]}" timeout --kill-after=10 "$limit" "${launcher[@]}" "$bin" "${args[@]}" 2>&1)
  rc=$?
  seconds=$(( $(date +%s) - start ))
  timings+=("$seconds"$'\t'"$name")
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
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "$name: TIMED OUT after ${limit}s"
  fi
  total_passed=$(( total_passed + passed ))
  total_failed=$(( total_failed + failed ))
  if [[ $failed -gt 0 ]]; then
    echo "---- $name (exit $rc) ----"
    echo "$output"
    echo "---- $name: $passed passed, $failed failed (${seconds}s); reproduce with:"
    echo "     ${env_args[*]} ${launcher[*]} $bin '${filter}'"
  else
    echo "$name: $passed passed (${seconds}s)"
  fi
done
done
if [[ ${#timings[@]} -gt 1 ]]; then
  total_s=0
  for t in "${timings[@]}"; do total_s=$(( total_s + ${t%%$'\t'*} )); done
  echo "slowest runs (of ${#timings[@]}, ${total_s}s in all):"
  printf '%s\n' "${timings[@]}" | sort -t$'\t' -k1,1nr | head -n 10 | awk -F'\t' '{printf "  %5ds  %s\n", $1, $2}'
fi
echo "$total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]]
