"""What every experiment shares: its workloads, the shared trace's location, tables and plots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.trace import SHARED_TRACE_NAME, Trace, read_jsonl
from kvpool.workloads import build

#: the shared Mooncake trace is looked up in a ``shared/data/mooncake`` folder next to (or above)
#: the checkout; KVPOOL_MOONCAKE_TRACE names another file

#: families of every experiment: the real conversation trace (when present) and the generated ones
FAMILIES = ("conversation", "tool", "docqa", "chat", "synthetic")


@dataclass
class Context:
    """How an experiment runs: quick or full, where the shared trace is, a progress callback."""

    quick: bool = False
    trace_path: Path | None = None
    seed: int = 0
    log: Callable[[str], None] = field(default=lambda _msg: None)

    def families(self) -> list[str]:
        """The families this run covers (the conversation trace only when it is present)."""
        return [f for f in FAMILIES if f != "conversation" or self.trace_path is not None]

    def requests(self, family: str) -> int:
        """Requests per generated trace: 10,000 in full runs, 1,500 in quick ones."""
        return 1_500 if self.quick else 10_000

    def load(self, family: str) -> Trace:
        """The trace of ``family`` (quick runs take the conversation trace's first 1,500 requests)."""
        if family == "conversation":
            if self.trace_path is None:
                raise FileNotFoundError(f"{SHARED_TRACE_NAME} not found (set KVPOOL_MOONCAKE_TRACE)")
            t = read_jsonl(self.trace_path)
            return head(t, self.requests(family)) if self.quick else t
        return build(family, n_requests=self.requests(family), seed=self.seed)


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests of ``trace``."""
    n = min(n, len(trace))
    end = int(trace.offsets[n])
    return Trace(
        trace.timestamps[:n],
        trace.input_lengths[:n],
        trace.output_lengths[:n],
        trace.offsets[: n + 1],
        trace.blocks[:end],
    )


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table (right-aligned columns), which is also what table.txt holds."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "| " + " | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)) + " |"
    out = [line, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"]
    for r in rows:
        out.append("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |")
    return "\n".join(out)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mib_label(mib: float) -> str:
    """``16 MiB``, ``1 GiB``, ``24 GiB``."""
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"
