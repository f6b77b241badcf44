#!/usr/bin/env bash
# Runs Catch2 test binaries, each under every schedule given, and aggregates their results into
# one closing line `N passed, M failed` (test cases), exiting non-zero if anything failed.
#
#   test/run_tests.sh [--filter 'CATCH TAG EXPRESSION'] [--timeout SECONDS] [--jobs N]
#                     [--schedule 'LABEL:VAR=VALUE,VAR=VALUE']... BINARY... [--alone BINARY...]
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
# A binary written `PATH[TAG]` or `PATH~[TAG]` runs only the test cases with (or without) that tag,
# on top of --filter: a suite whose few time-sensitive cases run --alone while the rest share the
# pool (Catch2 tags; a path holds no `[`).
#
# A binary written `mpi:N:PATH` is a multi-rank suite (test/catch_mpi_main.cpp): it runs as
# `mpirun -np N` on this machine (oversubscribed, allowed as root, ranks yielding when idle), each
# rank with one host worker and one OpenBLAS thread and the schedule's variables, under a timeout
# of MPI_TEST_TIMEOUT seconds (default 600); rank 0 prints the job's summary. The timeouts guard
# against hangs only, so each is several times its longest run: a job that ends for time fails
# whatever its code does (test_mpi_parallel at 4 ranks runs about 120 s on two cores, and a
# 120 s limit once ended it in its last test case). A rank whose test case was cut short ends the
# job within 15 s anyway (test/catch_mpi_main.cpp), so a limit is reached only by a real hang.
#
# --jobs N (default TEST_JOBS, else 1) runs up to N of the binaries before --alone at once; lines
# are printed as runs finish. The binaries after --alone run one at a time with nothing beside
# them: those whose assertions involve time (signals, stall watchdogs, multi-rank jobs under a
# timeout) and must not share the cores. No test result depends on how many run at once.
set -u
filter=""
timeout_s="${TEST_TIMEOUT:-900}"
mpi_timeout_s="${MPI_TEST_TIMEOUT:-600}"
jobs="${TEST_JOBS:-1}"
schedules=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --filter) filter="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --schedule) schedules+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
[[ ${#schedules[@]} -eq 0 ]] && schedules=(":")
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run_tests.sh: --jobs must be a positive integer (got '$jobs')"; exit 2; }

# The runs: "SPEC<TAB>SCHEDULE<TAB>ALONE" for every binary and each schedule it runs under.
runs=()
alone=0
for spec in "$@"; do
  if [[ $spec == --alone ]]; then alone=1; continue; fi
  only=""
  [[ "$spec" =~ ^([^@/]+)@(.+)$ ]] && only=${BASH_REMATCH[1]}
  for schedule in "${schedules[@]}"; do
    label="${schedule%%:*}"
    [[ -n "$only" && "$label" != "$only" ]] && continue
    runs+=("$spec"$'\t'"$schedule"$'\t'"$alone")
  done
done

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

# Runs one binary under one schedule; writes "PASSED FAILED SECONDS<TAB>NAME" to $results/N.count
# and what to print to $results/N.out.
run_one() {
  local n="$1" spec="$2" schedule="$3"
  local ranks=0 bin label vars name
  [[ "$spec" =~ ^([^@/]+)@(.+)$ ]] && spec=${BASH_REMATCH[2]}
  bin="$spec"
  if [[ "$spec" =~ ^mpi:([0-9]+):(.+)$ ]]; then
    ranks=${BASH_REMATCH[1]}
    bin=${BASH_REMATCH[2]}
  fi
  local cases="$filter"
  if [[ "$bin" =~ ^([^[~]+)(~?\[.+)$ ]]; then
    # The tag joins every alternative of the filter (Catch2: `,` is or, juxtaposition is and).
    bin=${BASH_REMATCH[1]}
    local tag=${BASH_REMATCH[2]} alternatives=() alternative
    IFS=',' read -r -a alternatives <<< "$filter"
    cases=""
    for alternative in "${alternatives[@]}"; do cases+="${cases:+,}$alternative$tag"; done
    [[ -z "$cases" ]] && cases="$tag"
  fi
  label="${schedule%%:*}"
  vars="${schedule#*:}"
  local env_args=()
  [[ -n "$vars" ]] && IFS=',' read -r -a env_args <<< "$vars"
  name=$(basename "$bin")
  [[ -n "${tag:-}" ]] && name="$name $tag"
  [[ $ranks -gt 0 ]] && name="$name -np $ranks"
  [[ -n "$label" ]] && name="$name [$label]"
  local args=()
  [[ -n "$cases" ]] && args+=("$cases")
  local launcher=()
  local limit="$timeout_s"
  if [[ $ranks -gt 0 ]]; then
    env_args=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 POLEVAULT_HOST_WORKERS=1 OPENBLAS_NUM_THREADS=1
              "${env_args[@]}")
    launcher=(mpirun -np "$ranks" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
    for v in "${env_args[@]}"; do launcher+=(-x "${v%%=*}"); done
    (( mpi_timeout_s < limit )) && limit="$mpi_timeout_s"
  fi
  local start output rc seconds passed="" failed=0
  start=$(date +%s)
  output=$(env "${env_args[@]}" timeout --kill-after=10 "$limit" "${launcher[@]}" "$bin" "${args[@]}" 2>&1 < /dev/null)
  rc=$?
  seconds=$(( $(date +%s) - start ))
  if [[ "$output" =~ All\ tests\ passed\ \(([0-9]+)\ assertions?\ in\ ([0-9]+)\ test\ cases?\) ]]; then
    passed=${BASH_REMATCH[2]}
  elif [[ "$output" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    passed=${BASH_REMATCH[2]}; failed=${BASH_REMATCH[3]}
  elif [[ "$output" =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    passed=0; failed=${BASH_REMATCH[2]}
  fi
  {
    if [[ -z "$passed" || ( $rc -ne 0 && $failed -eq 0 ) ]]; then
      # No summary (crash, abort, timeout) or a non-zero exit with nothing counted as failed.
      passed=${passed:-0}
      failed=$(( failed + 1 ))
    fi
    # Said whether or not a summary came: Catch2 reports SIGTERM (what timeout sends) as a failed
    # assertion in the running test case and prints its totals, which reads like a test failure.
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "$name: TIMED OUT after ${limit}s (the failure below is the limit's SIGTERM)"
    if [[ $failed -gt 0 ]]; then
      echo "---- $name (exit $rc) ----"
      echo "$output"
      echo "---- $name: $passed passed, $failed failed (${seconds}s); reproduce with:"
      echo "     ${env_args[*]} ${launcher[*]} $bin '${cases}'"
    else
      echo "$name: $passed passed (${seconds}s)"
    fi
  } > "$results/$n.out"
  printf '%s %s %s\t%s\n' "$passed" "$failed" "$seconds" "$name" > "$results/$n.count"
}

# The pool: up to $jobs runs at once; an --alone run waits for every other run to finish and
# starts nothing beside it. Each run's lines are printed when it finishes.
running=()  # indices of runs started and not yet printed
print_finished() {
  local still=() i
  for i in "${running[@]}"; do
    if [[ -f "$results/$i.count" ]]; then cat "$results/$i.out"; else still+=("$i"); fi
  done
  running=("${still[@]}")
}
for i in "${!runs[@]}"; do
  IFS=$'\t' read -r spec schedule run_alone <<< "${runs[$i]}"
  limit_now=$jobs
  [[ $run_alone == 1 ]] && limit_now=1
  while (( ${#running[@]} >= limit_now )); do
    wait -n 2> /dev/null || true
    print_finished
  done
  run_one "$i" "$spec" "$schedule" &
  running+=("$i")
  [[ $run_alone == 1 ]] && { wait; print_finished; }
done
wait
print_finished

total_passed=0 total_failed=0 total_s=0 counted=0
for f in "$results"/*.count; do
  [[ -f $f ]] || continue
  read -r p fl s _ < "$f"
  total_passed=$(( total_passed + p )) total_failed=$(( total_failed + fl )) total_s=$(( total_s + s ))
  counted=$(( counted + 1 ))
done
if (( counted < ${#runs[@]} )); then  # a run that left no count (the runner itself failed)
  echo "run_tests.sh: $(( ${#runs[@]} - counted )) run(s) reported nothing"
  total_failed=$(( total_failed + ${#runs[@]} - counted ))
fi
if [[ ${#runs[@]} -gt 1 ]]; then
  echo "slowest runs (of ${#runs[@]}, ${total_s}s in all, up to $jobs at once):"
  cat "$results"/*.count | cut -d' ' -f3- | sort -t$'\t' -k1,1nr | head -n 10 | awk -F'\t' '{printf "  %5ds  %s\n", $1, $2}'
fi
# The failures once more, briefly, just above the closing line: a log read from its end (a CI
# page that keeps only the tail) still names the failed assertion, not only the failed binary.
if (( total_failed > 0 )); then
  echo "failures (each failed run's first failed assertions; its whole output is above):"
  for f in "$results"/*.count; do
    [[ -f $f ]] || continue
    read -r _ fl _ name < "$f"
    (( fl > 0 )) || continue
    echo "  == $name"
    grep -a -E -A8 'FAILED:|TIMED OUT|^rank [0-9]+: |aborting the MPI job' "${f%.count}.out" | head -n 60 | sed 's/^/     /'
  done
fi
echo "$total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]]
