#!/usr/bin/env bash
# One entry point for a newcomer:
#   bash tools/dev.sh demo   # set up, then classify the 600-ticket workload on the default model and score it
#   bash tools/dev.sh test   # set up, then run the test suite
#   bash tools/dev.sh setup  # only set up (.venv in the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
VENV="$ROOT/.venv"
STAMP="$VENV/.mlx-slm-installed"

say() { echo "[dev.sh] $*" >&2; }

setup() {
  if [ "$(uname -s)" = Linux ]; then
    # MLX's Linux wheel ships a reference BLAS (~30x slower); an optimized CBLAS is loaded at import.
    if ! ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then
      if command -v apt-get >/dev/null; then
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        say "installing libopenblas0-pthread (optimized BLAS for MLX)"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null \
          || say "warning: could not install libopenblas0-pthread; MLX will run on its slow reference BLAS"
      else
        say "warning: no apt-get; install OpenBLAS with your package manager for fast MLX matmuls"
      fi
    fi
  fi
  if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt tools/dev.sh ]; then
    return
  fi
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if [ "$(uname -s)" = Linux ]; then
    # The CPU build of PyTorch, never a multi-GB CUDA build. Elsewhere than these machines,
    # set MLX_SLM_TORCH_INDEX=https://download.pytorch.org/whl/cpu to get it from PyTorch's index.
    if [ -n "${MLX_SLM_TORCH_INDEX:-}" ]; then
      "$VENV/bin/pip" install -q "torch==2.13.0" --index-url "$MLX_SLM_TORCH_INDEX"
    else
      "$VENV/bin/pip" install -q "torch==2.13.0"
    fi
  fi
  "$VENV/bin/pip" install -q -e ".[test,bench]"
  touch "$STAMP"
  say "ready: $VENV"
}

case "${1:-}" in
  setup) setup ;;
  test)
    setup
    shift
    # Lint and format first (ruff's settings are in pyproject.toml): a finding fails the run.
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
  demo)
    setup
    mkdir -p demo
    "$VENV/bin/python" -m benchmarks.workload --jsonl demo/tickets.jsonl
    "$VENV/bin/mlx-slm" doctor
    # Batch calibration: the model's bias toward one label, measured on the input itself, is divided out.
    "$VENV/bin/mlx-slm" classify demo/tickets.jsonl -o demo/predictions.jsonl --calibrate batch --on-error skip
    # How right the labels are, from the file just written (no second model run), with its plots.
    "$VENV/bin/mlx-slm" eval demo/tickets.jsonl --predictions demo/predictions.jsonl --json demo/eval.json --plots demo/eval
    ;;
  *)
    echo "usage: bash tools/dev.sh demo|test|setup [pytest args]" >&2
    exit 2
    ;;
esac
