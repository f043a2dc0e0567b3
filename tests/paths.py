"""Where the tests find the repository, their data and the shared trace (one definition)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from kvpool.trace import shared_trace_path

REPO: Final = Path(__file__).resolve().parents[1]
"""The checkout's root."""
DATA: Final = REPO / "tests" / "data"
"""Small committed test inputs (P4Info files, ...)."""
SCRIPTS: Final = REPO / "scripts"
P4RT_MINI: Final = DATA / "p4rt_mini.p4info.txtpb"
"""A small P4Info covering every match kind, for the codec, driver and server tests."""

MOONCAKE_TRACE: Final = shared_trace_path()
"""The real prefix-reuse trace (never copied into the repository; ``$KVPOOL_MOONCAKE_TRACE`` overrides)."""
