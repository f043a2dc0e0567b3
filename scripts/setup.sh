#!/usr/bin/env bash
# Set up kvpool from nothing on a Debian machine: system packages, a venv, the project.
# Idempotent and quick when nothing changed, so every entry point can call it first.
#   bash scripts/setup.sh            # as root: also installs Debian packages
# Environment: KVPOOL_VENV (default .venv), KVPOOL_SKIP_APT=1 to skip apt-get,
# KVPOOL_WITH_VLLM=0 to skip vLLM: by default vLLM with kvpool's connector is set up in its own venv
# (scripts/setup_vllm.sh, .venv-vllm: about 3.5 GB, a few minutes the first time) so the test command
# runs the connector's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVPOOL_VENV:-.venv}
APT_PACKAGES=(mininet iproute2 iputils-ping ethtool libibverbs1 libcurl4 libnuma1 tcpdump python3-venv)

say() { printf '[setup] %s\n' "$*"; }

# --- Debian packages (Mininet for emulation, libibverbs1 for Mooncake's transfer engine) ---
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})) && [[ "${KVPOOL_SKIP_APT:-0}" != 1 ]]; then
  if [[ $(id -u) -eq 0 ]]; then
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "not root: skipping Debian packages ${missing[*]} (Mininet tests will skip)"
  fi
fi

# --- Python 3.11 venv ---
PY=$(command -v python3.11 || command -v python3)
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "[setup] kvpool needs Python 3.11; $PY is $("$PY" -V)" >&2; exit 1
fi
[[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }

# Reinstall only when the project's dependency list changed.
stamp="$VENV/.kvpool-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  # dev = every extra (agent, controller, switch, mooncake, sim, experiment) + test tools.
  say "pip install -e .[dev] (torch==2.13.0 CPU build from local disk where present)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi

# --- Mininet's Python module, from Debian's package, without copying it ---
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ -d /usr/lib/python3/dist-packages/mininet && ! -e "$site/mininet" ]]; then
  ln -s /usr/lib/python3/dist-packages/mininet "$site/mininet"
  say "linked Debian's mininet module into $VENV"
fi
if [[ "${KVPOOL_WITH_VLLM:-1}" != 0 ]]; then
  bash scripts/setup_vllm.sh
fi
say "ready: $VENV"
