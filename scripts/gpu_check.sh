#!/usr/bin/env bash
# The prepared GPU check (issue 28): `bench ttft` and N typists on one engine, on a CUDA device in
# bfloat16, summed up in one table (bench/gpu_check.py). Its steps:
#
#   scripts/gpu_check.sh prepare       here (with the registry): the wheels the device machine lacks
#                                      and the data it needs (tokenizer, Spider's dev set and two
#                                      databases) into .gpu/ (git-ignored, ~25 MiB), to be carried
#   scripts/gpu_check.sh run [DIR]     on the device machine (its python3: torch 2.11, transformers
#                                      5.17, no registry): installs .gpu/whl into /tmp/site, runs the
#                                      check into DIR (default bench-out/gpu-check) and copies the
#                                      summary, tables and JSON into $OUT when set; ~5 minutes
#   scripts/gpu_check.sh dry-run [DIR] the same code on this CPU with random:tiny, on the carried
#                                      data where prepared (CI runs it: tests/test_gpu_check.py)
#   scripts/gpu_check.sh data          prepare's data alone (no registry needed; the test's step)
#   scripts/gpu_check.sh mimic [DIR]   the dry run on the device's Python stack (torch 2.11,
#                                      transformers 5.17, Python 3.12: a venv in .gpu-mimic/, made
#                                      once) and only what is carried: run it here before a lease
#
# The device tool's call: carry [".gpu"], timeout_s 480, command
#   set -o pipefail; scripts/gpu_check.sh run 2>&1 | tee $OUT/gpu_check.log
set -euo pipefail
cd "$(dirname "$0")/.."

# what bench.gpu_check imports that the device image does not hold (its package list:
# /work/.library/device/KINDS.md); versions are this checkout's venv's
WHEELS=(pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection
        psycopg psycopg-binary sqlglot sqlparse)
GPU_DIR=${GPU_DIR:-.gpu}  # relative to the checkout, or absolute

python_here() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; elif [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi
}

shared_root() {
  "$(python_here)" -c 'import sys; sys.path[:0] = ["shared"]; from headstart.paths import shared_data_root; print(shared_data_root())'
}

# the data the check reads, from ../shared into $GPU_DIR/shared: the tokenizer, Spider's dev set, its
# schemas (tables.json) and the two databases the check asks about
prepare_data() {
  local shared
  shared=$(shared_root)
  rm -rf "$GPU_DIR/shared" && mkdir -p "$GPU_DIR/shared/tokenizer" "$GPU_DIR/shared/spider/database"
  cp "$shared"/models/qwen2.5-coder-tokenizer/* "$GPU_DIR/shared/tokenizer/"
  cp "$shared"/data/spider/dev.json "$shared"/data/spider/tables.json "$GPU_DIR/shared/spider/"
  for db in world_1 car_1; do cp -r "$shared/data/spider/database/$db" "$GPU_DIR/shared/spider/database/"; done
}

prepare() {
  local py
  py=$(python_here)
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$GPU_DIR/" "$exclude" 2>/dev/null || echo "/$GPU_DIR/" >> "$exclude"
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/whl"
  local pins=()
  for name in "${WHEELS[@]}"; do
    pins+=("$name==$("$py" -c "import importlib.metadata as m; print(m.version('$name'))")")
  done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$GPU_DIR/whl" "${pins[@]}"
  prepare_data
  du -sh "$GPU_DIR"
  echo "carry [\"$GPU_DIR\"], command: set -o pipefail; scripts/gpu_check.sh run 2>&1 | tee \$OUT/gpu_check.log"
}

# the carried data, where prepared, instead of ../shared (which does not travel)
use_carried_data() {
  if [ -d "$GPU_DIR/shared" ]; then
    local data
    data=$(cd "$GPU_DIR/shared" && pwd)
    export HEADSTART_TOKENIZER=$data/tokenizer HEADSTART_SPIDER_DIR=$data/spider
  fi
}

run_check() {
  local out=${1:-bench-out/gpu-check}
  if compgen -G "$GPU_DIR/whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$GPU_DIR"/whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  use_carried_data
  export HEADSTART_HOME=${HEADSTART_HOME:-/tmp/headstart-gpu-check} PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
  local rc=0
  # past the deadline every thread's stack is printed and the check exits: a hang leaves its cause
  # GPU_CHECK_ARGS: more of bench.gpu_check's options (--phases, --dtype, --questions)
  # shellcheck disable=SC2086
  PYTHONPATH=shared:.${PYTHONPATH:+:$PYTHONPATH} python3 -m bench.gpu_check --out "$out" \
    --deadline-s "${GPU_CHECK_DEADLINE_S:-420}" ${GPU_CHECK_ARGS:-} || rc=$?
  # the device tool brings back at most 8 files from $OUT: the summary, the tables and JSON, and the log
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    for f in "$out"/gpu_check.md "$out"/gpu_check.json "$out"/ttft/ttft.md "$out"/ttft/ttft.json \
             "$out"/typists/typists.md "$out"/typists/typists.json "$out"/floor/gpu_floor.md; do
      [ -f "$f" ] && cp "$f" "$OUT/"
    done
  fi
  return $rc
}

# the device image's Python stack (KINDS.md's versions) for `mimic`; git-ignored, a few GiB, made once
DEVICE_PINS=(torch==2.11.0 transformers==5.17.0 numpy==2.5.2 tokenizers==0.23.2 safetensors==0.8.0
             accelerate==1.15.0 huggingface_hub==1.33.0 matplotlib)
MIMIC_VENV=${MIMIC_VENV:-.gpu-mimic}

# the dry run as the device machine would run it, on this CPU: its Python and library versions
# (a venv made once with MIMIC_PYTHON, default python3.12), only the carried wheels and data,
# ../shared unreachable, the server packages unimportable. What a device run would hit before
# any model work (a file `prepare` does not carry, an API the device's older versions lack)
# shows here, without spending a lease.
mimic() {
  local out=${1:-bench-out/gpu-check-mimic} py=${MIMIC_PYTHON:-python3.12}
  if ! compgen -G "$GPU_DIR/whl/*.whl" >/dev/null || [ ! -d "$GPU_DIR/shared" ]; then
    echo "nothing carried in $GPU_DIR: run 'scripts/gpu_check.sh prepare' first" >&2
    exit 2
  fi
  if [ ! -x "$MIMIC_VENV/bin/python" ]; then
    command -v "$py" >/dev/null || { echo "no $py here: set MIMIC_PYTHON to a Python 3.12" >&2; exit 2; }
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qxF "/$MIMIC_VENV/" "$exclude" 2>/dev/null || echo "/$MIMIC_VENV/" >> "$exclude"
    "$py" -m venv "$MIMIC_VENV"
    "$MIMIC_VENV/bin/pip" install -q "${DEVICE_PINS[@]}"
  fi
  local site="$MIMIC_VENV/carried"
  rm -rf "$site"
  "$MIMIC_VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$GPU_DIR"/whl/*.whl
  use_carried_data
  HEADSTART_SHARED=/nonexistent HEADSTART_HOME=${HEADSTART_HOME:-/tmp/headstart-gpu-mimic} PYTHONUNBUFFERED=1 \
    PYTHONPATH=scripts/gpu_bare:$site:shared:. "$MIMIC_VENV/bin/python" -m bench.gpu_check --dry-run --out "$out"
}

dry_run() {
  local out=${1:-bench-out/gpu-check-dry}
  use_carried_data
  PYTHONPATH=shared:.${PYTHONPATH:+:$PYTHONPATH} "$(python_here)" -m bench.gpu_check --dry-run --out "$out"
}

case "${1:-}" in
  prepare) prepare ;;
  data) prepare_data ;;
  mimic) shift; mimic "$@" ;;
  run) shift; run_check "$@" ;;
  dry-run) shift; dry_run "$@" ;;
  *) echo "usage: scripts/gpu_check.sh prepare | data | run [DIR] | dry-run [DIR] | mimic [DIR]" >&2; exit 2 ;;
esac
