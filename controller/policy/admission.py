"""Admission gate: a candidate enters a full pool only if it beats the victims it would displace.

TinyLFU-style: the sketch counts every fetch of every chunk; a chunk still on probation (seen
fewer than ``probation_hits`` times within the sketch's half-life) stays out of a full pool,
which keeps one-shot prefixes from flushing it; past probation, the candidate's reuse value
must exceed the summed value of its victims.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.policy.sketch import FrequencySketch


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to admit, and why (the reason goes into the change log)."""

    admit: bool
    reason: str


class AdmissionGate:
    """Probation plus value comparison against the would-be victims."""

    def __init__(self, sketch: FrequencySketch, probation_hits: int = 2) -> None:
        if probation_hits < 1:
            raise ValueError(f"probation_hits must be at least 1, got {probation_hits}")
        self.sketch = sketch
        self.probation_hits = probation_hits

    def record(self, key: int) -> int:
        """Count one fetch of ``key``; returns its decayed fetch-count estimate."""
        return self.sketch.add(key)

    def on_probation(self, estimate: int) -> bool:
        """Whether a chunk with this fetch-count estimate is still on probation."""
        return estimate < self.probation_hits

    def admits(self, estimate: int, candidate_worth: float, victims_worth: float | None) -> bool:
        """The verdict of :meth:`judge` without building its reason (the hot path of shadow pools)."""
        if victims_worth is None:
            return True
        return estimate >= self.probation_hits and candidate_worth > victims_worth

    def judge(self, estimate: int, candidate_worth: float, victims_worth: float | None) -> Verdict:
        """Verdict for a candidate; ``victims_worth`` is None when it fits in free space."""
        if victims_worth is None:
            return Verdict(True, "fits in free space")
        if self.on_probation(estimate):
            return Verdict(False, f"on probation: seen {estimate} < {self.probation_hits} times")
        if candidate_worth > victims_worth:
            return Verdict(True, f"value {candidate_worth:.3g} beats victims' {victims_worth:.3g}")
        return Verdict(False, f"value {candidate_worth:.3g} does not beat victims' {victims_worth:.3g}")
