#!/usr/bin/env bash
# Prove that the host agent lives in an inference engine's environment: a venv with only
# kvpool[agent] and protobuf 6 (what vLLM and LMCache need; the controller's P4Runtime
# stack pins protobuf < 3.21), in which every hostagent module imports without grpc,
# p4runtime, scapy or the controller, and two real agents move a transformers prefix KV
# over loopback UDP bit-exactly. scripts/test.sh runs it; reinstalls only when
# pyproject.toml changed.
#   bash scripts/check_agent_env.sh      # KVPOOL_AGENT_VENV (default .venv-agent)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVPOOL_AGENT_VENV:-.venv-agent}
say() { printf '[agent-env] %s\n' "$*"; }

PY=$(command -v python3.11 || command -v python3)
[[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
stamp="$VENV/.kvpool-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  say "pip install -e .[agent] 'protobuf>=6,<7' (+ pytest to run the agents' end-to-end test)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e '.[agent]' 'protobuf>=6,<7' pytest pytest-timeout
  echo "$want" > "$stamp"
fi

"$VENV/bin/python" - <<'PYEOF'
import importlib
import importlib.util
import pkgutil
import sys

# The checkout's own p4/ folder would pass for the p4runtime package from the cwd.
sys.path[:] = [p for p in sys.path if p not in ("", ".")]

import google.protobuf  # noqa: E402

import hostagent  # noqa: E402

major = int(google.protobuf.__version__.split(".")[0])
assert major == 6, f"expected protobuf 6 in this venv, found {google.protobuf.__version__}"
# Modules for an engine that kvpool[agent] does not install (their own extra) import only beside it.
ENGINE_ONLY = {"hostagent.vllm_connector": "vllm"}
names = sorted(m.name for m in pkgutil.walk_packages(hostagent.__path__, "hostagent."))
names = [n for n in names if n not in ENGINE_ONLY or importlib.util.find_spec(ENGINE_ONLY[n]) is not None]
for name in names:
    importlib.import_module(name)
foreign = sorted({m.split(".")[0] for m in sys.modules} & {"grpc", "p4", "p4runtime_sh", "scapy", "controller",
                                                           "switchmodel", "bmv2_topologies"})
assert not foreign, f"hostagent pulled in {foreign}"
for pkg in ("grpc", "p4.v1", "scapy"):
    try:
        importlib.import_module(pkg)
    except ImportError:
        continue
    raise AssertionError(f"{pkg} is installed in the agent venv: kvpool[agent] must not need it")
print(f"[agent-env] {len(names)} hostagent modules import beside protobuf {google.protobuf.__version__}")
PYEOF
"$VENV/bin/kvpool-agent" --help >/dev/null
say "kvpool-agent --help ok"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/hostagent/test_e2e_agents.py
