"""Where the tests find the repository, their data and the shared trace (one definition)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
"""The checkout's root."""
DATA: Final = REPO / "tests" / "data"
"""Small committed test inputs (P4Info files, ...)."""
SCRIPTS: Final = REPO / "scripts"
P4RT_MINI: Final = DATA / "p4rt_mini.p4info.txtpb"
"""A small P4Info covering every match kind, for the codec, driver and server tests."""

SHARED_DATA_ENV: Final = "KVPOOL_SHARED_DATA"
"""Names the shared data folder when it is not ``../shared/data`` beside the checkout."""
SHARED_DATA: Final = Path(os.environ.get(SHARED_DATA_ENV) or REPO.parent / "shared" / "data")
MOONCAKE_TRACE: Final = SHARED_DATA / "mooncake" / "conversation_trace_first_half.jsonl"
"""The real prefix-reuse trace (never copied into the repository)."""
