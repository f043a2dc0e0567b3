"""The committed p4/build/ outputs are what p4c makes of the current P4 sources.

Runs only where p4c-bm2-ss is available (on PATH, or named by KVPOOL_P4C); it compiles
into a temporary directory with the same command as p4/Makefile and compares.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvpool import contract

P4_DIR = contract.P4_DIR
COMMITTED = contract.BUILD_DIR
P4C = os.environ.get("KVPOOL_P4C") or shutil.which("p4c-bm2-ss")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(P4C is None, reason="p4c-bm2-ss not on PATH and KVPOOL_P4C not set"),
]


@dataclass(frozen=True)
class Compiled:
    """One fresh compile of p4/kvpool.p4."""

    out: Path
    stderr: str
    version: str


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """Compile once per module, from p4/ so that source paths match the Makefile's."""
    assert P4C is not None
    out = tmp_path_factory.mktemp("p4build")
    cmd = [P4C, "--std", "p4-16", "--arch", "v1model", "-o", str(out / contract.BMV2_JSON_FILE),
           "--p4runtime-files", str(out / contract.P4INFO_FILE), "kvpool.p4"]
    proc = subprocess.run(cmd, cwd=P4_DIR, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"p4c failed:\n{proc.stderr}"
    # p4c prints its version on stderr; the Makefile records both streams.
    version = subprocess.run([P4C, "--version"], capture_output=True, text=True, timeout=60, check=True)
    return Compiled(out, proc.stderr, version.stdout + version.stderr)


def _version_line(text: str) -> str:
    """The `Version ...` line of `p4c-bm2-ss --version` (the line before it is argv[0])."""
    return next((line.strip() for line in text.splitlines() if line.startswith("Version")), text.strip())


def _without_source_info(node: Any) -> Any:
    """The BMv2 JSON minus source_info, which names the compiler's own include paths."""
    if isinstance(node, dict):
        return {k: _without_source_info(v) for k, v in node.items() if k != "source_info"}
    if isinstance(node, list):
        return [_without_source_info(v) for v in node]
    return node


def test_compiles_without_warnings(compiled: Compiled) -> None:
    assert "warning" not in compiled.stderr.lower(), compiled.stderr


def test_p4info_matches_committed(compiled: Compiled) -> None:
    fresh = (compiled.out / contract.P4INFO_FILE).read_text()
    assert fresh == (COMMITTED / contract.P4INFO_FILE).read_text(), "run `make -C p4` and commit p4/build/"


def test_bmv2_json_matches_committed(compiled: Compiled) -> None:
    committed_version = _version_line((COMMITTED / contract.P4C_VERSION_FILE).read_text())
    if _version_line(compiled.version) != committed_version:
        pytest.skip(f"p4c {_version_line(compiled.version)!r} differs from the committed build's "
                    f"{committed_version!r}; only the P4Info is compared")
    fresh = json.loads((compiled.out / contract.BMV2_JSON_FILE).read_text())
    committed = json.loads((COMMITTED / contract.BMV2_JSON_FILE).read_text())
    assert _without_source_info(fresh) == _without_source_info(committed), "run `make -C p4` and commit p4/build/"
