#!/usr/bin/env bash
# Runs each fuzz target given (build/fuzz/fuzz_<reader>) for FUZZ_SECONDS on its committed
# corpus fuzz/corpus/<reader>/, and prints one line per target and a closing `N passed, M failed`
# (a target passes when libFuzzer found nothing: no crash, sanitizer report, timeout or
# out-of-memory). What a run finds new goes to build/fuzz/corpus/<reader>/ (the committed corpus
# is only read); a failing input to build/fuzz/artifacts/<reader>/, named in the log
# build/fuzz/logs/<reader>.log.
#
#   FUZZ_SECONDS   seconds per target (default 10)
#   FUZZ_RUNS      stop a target after this many executions (or FUZZ_SECONDS, whichever comes first)
#   FUZZ_FLAGS     more libFuzzer flags (e.g. -seed=1)
#   FUZZ_JOBS      targets fuzzed at once (default: one per core)
#
# Limits for every target: -rss_limit_mb=2048 and -malloc_limit_mb=512 (no reader may allocate
# more for inputs of at most max_len bytes: that is a finding), -timeout=10 s per input, and the
# max_len below, chosen per format to hold its seeds.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A max_len=(
  [safetensors]=16384 [config_json]=4096 [tokenizer_json]=65536 [trainer_state]=4096 [shard]=8192
  [examples]=4096 [llama2c]=16384 [peft_config]=4096 [bnb_checkpoint]=8192
)
seconds=${FUZZ_SECONDS:-10}
jobs=${FUZZ_JOBS:-$(nproc)}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "fuzz/run.sh: FUZZ_JOBS must be a positive integer (got '$jobs')"; exit 2; }
lines=$(mktemp -d)
trap 'rm -rf "$lines"' EXIT

# Fuzzes one target; writes its line(s) to $lines/N.ok or $lines/N.failed.
fuzz_one() {
  local n="$1" bin="$2" reader work artifacts log rc=0 execs rate
  reader=$(basename "$bin"); reader=${reader#fuzz_}
  work=build/fuzz/corpus/$reader artifacts=build/fuzz/artifacts/$reader log=build/fuzz/logs/$reader.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  local limit=(-max_total_time="$seconds")
  [[ -n ${FUZZ_RUNS:-} ]] && limit+=(-runs="$FUZZ_RUNS")
  # shellcheck disable=SC2086
  "$bin" "${limit[@]}" -max_len="${max_len[$reader]:-4096}" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" ${FUZZ_FLAGS:-} "$work" "fuzz/corpus/$reader" > "$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  if [[ $rc -eq 0 ]]; then
    echo "fuzz $reader: ok, ${execs:-?} executions (${rate:-?}/s), no findings" > "$lines/$n.tmp"
    mv "$lines/$n.tmp" "$lines/$n.ok"
  else
    { echo "fuzz $reader: FAILED (exit $rc) after ${execs:-?} executions; see $log:"
      grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz finding|.*runtime error|artifact_prefix|Test unit written)' "$log" | head -n 8
    } > "$lines/$n.tmp"
    mv "$lines/$n.tmp" "$lines/$n.failed"
  fi
}

# FUZZ_JOBS targets at once (default: one per core): each is one process on one core, and its
# FUZZ_SECONDS are its own, so running them side by side fuzzes each as long, in less wall time.
n=0
for bin in "$@"; do
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n 2> /dev/null || true; done
  fuzz_one "$n" "$bin" &
  n=$(( n + 1 ))
done
wait
passed=0 failed=0
for (( i = 0; i < n; i++ )); do
  if [[ -f $lines/$i.ok ]]; then
    passed=$(( passed + 1 )); cat "$lines/$i.ok"
  elif [[ -f $lines/$i.failed ]]; then
    failed=$(( failed + 1 )); cat "$lines/$i.failed"
  else
    failed=$(( failed + 1 )); echo "fuzz $(basename "${@:i+1:1}"): the runner reported nothing"
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
