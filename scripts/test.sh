#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run every check: ruff, mypy, the agent's own environment
# (scripts/check_agent_env.sh), then the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k wire`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${KVPOOL_VENV:-.venv}
echo "[test] ruff"; "$VENV/bin/ruff" check .
echo "[test] mypy"; "$VENV/bin/mypy" kvpool hostagent controller switchmodel bmv2_topologies scripts tests
echo "[test] agent beside protobuf 6"; bash scripts/check_agent_env.sh
if [[ "${KVPOOL_WITH_VLLM:-1}" != 0 ]]; then
  # The main venv cannot hold vLLM (protobuf): its connector's tests run here, in vLLM's venv
  # (set up by scripts/setup.sh), and skip with a reason in the main venv's run below.
  echo "[test] vLLM connector"
  "${KVPOOL_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -q tests/hostagent/test_vllm_*.py tests/bmv2_topologies/test_vllm_*.py
fi
echo "[test] pytest"; exec "$VENV/bin/python" -m pytest "$@"
