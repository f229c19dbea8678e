#!/usr/bin/env bash
# Stress: the fault suites, N rounds in a row, with both cores kept busy.
#
#     bash benchmarks/stress_faults.sh            # 10 rounds
#     bash benchmarks/stress_faults.sh 3          # 3 rounds
#     PYTEST_ARGS="-x -k killed" bash benchmarks/stress_faults.sh 5
#
# Why: the fault tests time detection and check who is blamed; a loaded machine (a CI runner
# shared with other jobs) stretches every gap between two processes' actions, and a race that
# never shows on an idle machine does there. Issue 18's bar: the suites pass 10 rounds in a
# row beside two busy loops, one per core of the 2-core development machine.
#
# What it does: starts one busy loop (`python -c 'while 1: pass'`) per core, runs
# the suites of faults, bad input and signals (SUITES) once per round, prints one line per round
# (passed or failed, the counts pytest reports, the seconds taken), keeps each round's full
# output in $STRESS_LOGS (default /tmp/stress_faults), and ends with a tally. On any exit
# (the trap: the end, Ctrl-C, SIGTERM) the busy loops and a round still running are stopped.
# Exit status: 0 when every round passed.
set -u

ROUNDS=${1:-10}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
    echo "stress_faults.sh: rounds must be a whole number >= 1, got '$ROUNDS'" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
LOGS=${STRESS_LOGS:-/tmp/stress_faults}
mkdir -p "$LOGS"
BUSY=${BUSY_LOOPS:-$(nproc 2>/dev/null || echo 2)}
# The suites whose tests start processes and time or blame them: faults on the wire and in
# training, bad input at the real entry point, signals and lifetimes.
SUITES=${SUITES:-tests/test_comm_faults.py tests/faults/ tests/test_bad_input.py tests/test_lifetime.py}

# Job control: every command started in the background gets a process group of its own,
# with SIGINT not ignored (as it would be without -m), so a round's pytest and every worker
# it started can be stopped together, by their group, and pytest cleans up on SIGINT.
set -m
busy_pids=()
test_pid=""
stop_all() {
    if [ -n "$test_pid" ]; then  # pytest first: on SIGINT it stops its jobs and exits
        kill -INT -- "-$test_pid" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$test_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$test_pid" 2>/dev/null
        test_pid=""
    fi
    for pid in "${busy_pids[@]}"; do
        kill "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    busy_pids=()
}
trap stop_all EXIT
trap 'echo "stress: interrupted"; exit 130' INT
trap 'echo "stress: terminated"; exit 143' TERM

for _ in $(seq "$BUSY"); do
    "$PYTHON" -c 'while 1: pass' &
    busy_pids+=($!)
done
echo "stress: $ROUNDS rounds of $SUITES beside $BUSY busy" \
     "loops (pids ${busy_pids[*]}); logs in $LOGS"

passed=0
failed_rounds=()
for round in $(seq "$ROUNDS"); do
    log="$LOGS/round$round.log"
    start=$(date +%s)
    # In the background and waited for: a trapped signal interrupts `wait` at once, where
    # a command in the foreground would first run to its end.
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words on purpose
    # shellcheck disable=SC2086  # SUITES too
    "$PYTHON" -m pytest -q -p no:cacheprovider $SUITES ${PYTEST_ARGS:-} >"$log" 2>&1 &
    test_pid=$!
    wait "$test_pid"
    rc=$?
    test_pid=""
    seconds=$(( $(date +%s) - start ))
    counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error)" "$log" | tail -n 1 | tr -d '=' |
             sed 's/^ *//; s/ *$//')
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        echo "round $round/$ROUNDS: passed ($counts) in ${seconds} s"
    else
        failed_rounds+=("$round")
        echo "round $round/$ROUNDS: FAILED rc $rc (${counts:-no summary}) in ${seconds} s; $log"
        grep -E "^(FAILED|ERROR) " "$log" | sed 's/^/    /'
    fi
done
echo "stress: $passed of $ROUNDS rounds passed" \
     "${failed_rounds[*]:+(failed: rounds ${failed_rounds[*]})}"
[ "$passed" -eq "$ROUNDS" ]
