#!/usr/bin/env bash
# The prepared GPU check (issue 28): `bench ttft` and N typists on one engine, on a CUDA device in
# bfloat16, summed up in one table (bench/gpu_check.py). Three steps:
#
#   scripts/gpu_check.sh prepare       here (with the registry): the wheels the device machine lacks
#                                      and the data it needs (tokenizer, Spider's dev set and two
#                                      databases) into .gpu/ (git-ignored, ~25 MiB), to be carried
#   scripts/gpu_check.sh run [OUT]     on the device machine (its python3: torch 2.11, transformers
#                                      5.17, no registry): installs .gpu/whl into /tmp/site, runs the
#                                      check into OUT (default $OUT or bench-out/gpu-check); ~4 minutes
#   scripts/gpu_check.sh dry-run [OUT] the same code on this CPU with random:tiny (CI runs it:
#                                      tests/test_gpu_check.py)
#
# The device tool's call: command "scripts/gpu_check.sh run", carry [".gpu"], timeout_s 480.
set -euo pipefail
cd "$(dirname "$0")/.."

# what bench.gpu_check imports that the device image does not hold (its package list:
# /work/.library/device/KINDS.md); versions are this checkout's venv's
WHEELS=(pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection
        psycopg psycopg-binary sqlglot sqlparse)
GPU_DIR=.gpu

python_here() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; elif [ -x .venv/bin/python ]; then echo .venv/bin/python; else echo python3; fi
}

prepare() {
  local py shared
  py=$(python_here)
  shared=$("$py" -c 'import sys; sys.path[:0] = ["shared"]; from headstart.paths import shared_data_root; print(shared_data_root())')
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$GPU_DIR/" "$exclude" 2>/dev/null || echo "/$GPU_DIR/" >> "$exclude"
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/whl" "$GPU_DIR/shared/tokenizer" "$GPU_DIR/shared/spider/database"
  local pins=()
  for name in "${WHEELS[@]}"; do
    pins+=("$name==$("$py" -c "import importlib.metadata as m; print(m.version('$name'))")")
  done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$GPU_DIR/whl" "${pins[@]}"
  cp "$shared"/models/qwen2.5-coder-tokenizer/* "$GPU_DIR/shared/tokenizer/"
  cp "$shared"/data/spider/dev.json "$GPU_DIR/shared/spider/"
  for db in world_1 car_1; do cp -r "$shared/data/spider/database/$db" "$GPU_DIR/shared/spider/database/"; done
  du -sh "$GPU_DIR"
  echo "carry [\"$GPU_DIR\"], command: scripts/gpu_check.sh run"
}

run_check() {
  local out=${1:-${OUT:-bench-out/gpu-check}}
  if compgen -G "$GPU_DIR/whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$GPU_DIR"/whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [ -d "$GPU_DIR/shared" ]; then
    export HEADSTART_TOKENIZER=$PWD/$GPU_DIR/shared/tokenizer HEADSTART_SPIDER_DIR=$PWD/$GPU_DIR/shared/spider
  fi
  export HEADSTART_HOME=${HEADSTART_HOME:-/tmp/headstart-gpu-check} PYTHONUNBUFFERED=1
  PYTHONPATH=shared:.${PYTHONPATH:+:$PYTHONPATH} python3 -m bench.gpu_check --out "$out"
}

dry_run() {
  local out=${1:-bench-out/gpu-check-dry}
  PYTHONPATH=shared:.${PYTHONPATH:+:$PYTHONPATH} "$(python_here)" -m bench.gpu_check --dry-run --out "$out"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run_check "$@" ;;
  dry-run) shift; dry_run "$@" ;;
  *) echo "usage: scripts/gpu_check.sh prepare | run [OUT] | dry-run [OUT]" >&2; exit 2 ;;
esac
