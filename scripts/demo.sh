#!/usr/bin/env bash
# The main job: set up from nothing (scripts/setup.sh) and run the end-to-end Mininet demo.
# Needs root (Mininet). Extra arguments go to `kvpool demo`, e.g. `--requesters 4 --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
  echo "scripts/demo.sh: Mininet needs root; run it with sudo" >&2
  exit 1
fi
bash scripts/setup.sh
exec .venv/bin/kvpool demo "$@"
