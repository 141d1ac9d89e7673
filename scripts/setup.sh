#!/usr/bin/env bash
# Set xover up from a fresh clone, then run the main job or the tests.
#
#   bash scripts/setup.sh run  [xover study args]   # venv + package + llama.cpp build, then `xover study`
#   bash scripts/setup.sh test [pytest args]        # venv + package + llama.cpp build, then the test suite
#
# Needs only Python >= 3.10, cmake and a C++ compiler. The llama.cpp build is cached per user
# (~/.cache/xover), so only the first run pays for it (about 5-9 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
  run|test) shift ;;
  *) echo "usage: bash scripts/setup.sh run|test [args...]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python3}
venv=.venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  rm -rf "$venv"
  if ! "$PY" -m venv "$venv" 2>/dev/null; then
    # Debian ships venv support separately (python3.X-venv).
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      echo "setup: installing python${pyver}-venv with apt-get" >&2
      apt-get update -qq && (apt-get install -y -qq "python${pyver}-venv" || apt-get install -y -qq python3-venv)
      "$PY" -m venv "$venv"
    else
      echo "setup: '$PY -m venv' failed; install your distribution's python3-venv package and retry" >&2
      exit 1
    fi
  fi
fi

extras="build"
[ "$mode" = test ] && extras="build,test"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[$extras]"

# The report tests render the HTML report in a real browser: Debian's Chromium, driven by Playwright.
if [ "$mode" = test ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium with apt-get (for the report rendering test)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  else
    echo "setup: the tests need Chromium: install your distribution's chromium package and retry" >&2
    exit 1
  fi
fi

# Build (or find in the cache) llama-bench and llama-server for the CPU backend.
"$venv/bin/xover" llama build

if [ "$mode" = run ]; then
  exec "$venv/bin/xover" study "$@"
fi

# The engine comparison's tests run ik_llama.cpp beside mainline: its CPU build, from the ik-llama-cpp-python sdist
# (about 14 minutes on 2 cores, cached like mainline's).
"$venv/bin/xover" llama build --engine ik_llama.cpp

# The backend comparison's tests run mainline's Vulkan build on Mesa's lavapipe: its dependencies from the
# distribution's registry (scripts/vulkan-deps.sh), then the build (cached like the others).
bash scripts/vulkan-deps.sh
"$venv/bin/xover" llama build --backend vulkan

# Static checks first (import-linter's layer contracts run inside the tests: tests/unit/test_architecture.py).
"$venv/bin/ruff" check src tests benchmarks || { echo "setup: ruff found lint errors (above; 'ruff check --fix' fixes most)" >&2; exit 1; }
"$venv/bin/ruff" format --check src tests benchmarks || { echo "setup: files need 'ruff format src tests benchmarks'" >&2; exit 1; }
"$venv/bin/mypy" || { echo "setup: mypy found type errors (above)" >&2; exit 1; }

set +e
"$venv/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
  echo "setup: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"
