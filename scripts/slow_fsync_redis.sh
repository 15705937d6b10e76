#!/usr/bin/env bash
# The Redis-restart load test with the data store's fsync slowed on demand (issue 45):
#
#     scripts/slow_fsync_redis.sh [N]      # N runs in a row (5 by default)
#
# Runs tests/test_loadtest.py::test_short_mixed_run_survives_a_redis_restart N times with every
# Redis it starts wrapped by scripts/redis_server_slow_fsync.sh (each fdatasync delayed
# $SLOW_FSYNC_US microseconds, 1.5 s by default, through strace: apt-get install strace), and
# prints for each run the acknowledged rows lost and whether any push was refused with
# INVALID_ARGUMENT. Exits non-zero when a run failed. $PYTHON: the interpreter (.venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.."
repeat="${1:-5}"
python="${PYTHON:-.venv/bin/python}"
command -v strace >/dev/null || { echo "strace is not installed (apt-get install strace)" >&2; exit 2; }
export HEADSTART_REDIS_SERVER="$PWD/scripts/redis_server_slow_fsync.sh"
export SLOW_FSYNC_US="${SLOW_FSYNC_US:-1500000}"
test_id="tests/test_loadtest.py::test_short_mixed_run_survives_a_redis_restart"
failed=0
for run in $(seq 1 "$repeat"); do
    dir="$(mktemp -d -t slow-fsync-XXXXXX)"  # pytest empties its --basetemp: the log lives beside it
    "$python" -m pytest -q -p no:cacheprovider --basetemp "$dir/tmp" "$test_id" >"$dir/pytest.log" 2>&1
    status=$?
    [ "$status" -eq 0 ] || failed=1
    "$python" - "$run" "$status" "$dir" <<'PY'
import json, pathlib, sys

run, status, dir = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
base = dir / "tmp"
found = sorted(base.glob("*/mixed/loadtest.json"))
if not found:
    print(f"run {run}: pytest exit {status}, no loadtest.json (log: {dir}/pytest.log)")
    sys.exit()
faults = json.loads(found[0].read_text())["meta"]["faults"]
acked, errors = faults["acked"], faults["errors"]
out = found[0].parent  # the run's own files (the clients' failures) and its log
texts = [p.read_text(errors="replace") for p in [*out.glob("*.csv"), *out.glob("*.jsonl"), *base.glob("*/loadtest.log")]]
invalid = errors["by_code"].get("INVALID_ARGUMENT", 0)  # requests that failed with it
mentions = sum(t.count("INVALID_ARGUMENT") for t in texts)  # anywhere in the run's files and log
print(f"run {run}: pytest exit {status}; acknowledged rows lost: {acked['lost_rows']} of {acked['acked_rows']} "
      f"({acked['sessions']} sessions, {len(acked['sessions_behind'])} behind); INVALID_ARGUMENT: {invalid} requests, "
      f"{mentions} mentions; "
      f"errors by code: {errors['by_code']} (files: {dir})")
PY
done
exit "$failed"
