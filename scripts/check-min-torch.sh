#!/usr/bin/env bash
# Check tuilaunch against the oldest torch it supports (pyproject: torch>=2.6).
#
# Builds .venv-min with torch==$MIN_TORCH (a multi-GB CUDA build from PyPI: not part of the
# regular suite) and runs the launcher tests that exercise torch's API surface: the parser,
# the agent hooks, failures, restarts, signals and logs.
#   scripts/check-min-torch.sh            # MIN_TORCH=2.6.0
#   MIN_TORCH=2.7.1 scripts/check-min-torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_TORCH="${MIN_TORCH:-2.6.0}"
VENV=.venv-min
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$MIN_TORCH')" 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$MIN_TORCH"
fi
"$VENV/bin/pip" install -q -e '.[test]'
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_smoke.py tests/test_cli.py tests/test_bad_input.py tests/test_failures.py \
    tests/test_restarts.py tests/test_signals.py tests/test_logs.py tests/test_env_parity.py \
    tests/test_control.py "$@"
