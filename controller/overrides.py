"""Operator overrides: what the operator API asks of the pool, and how the pool says no.

An :class:`Override` is queued with ``Controller.submit`` and applied by the epoch loop at
the start of its next epoch, so the policy and the switches never see it half-done; a
refusal is an :class:`OverrideRefusedError` whose ``code`` the API returns as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.settings import ControllerError


class OverrideRefusedError(ControllerError):
    """An operator override the pool cannot honour; ``code`` names why (see ``Controller.override``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Override:
    """One operator override; the epoch loop applies it at the start of its next epoch.

    ``op`` is ``admit``, ``evict`` (``demote`` or drop), ``pin``, ``unpin``, ``quota``
    (``tenant``, ``slots``; None lifts the quota) or ``republish`` (the directory issued
    ``generation`` for ``key`` with ``nbytes`` bytes: every switch moves off the old bytes).
    """

    op: str
    key: int = 0
    demote: bool = True
    tenant: int = 0
    slots: int | None = None
    generation: int = 0
    nbytes: int = 0
