"""The driver's errors: every failure is a :class:`P4RuntimeError` naming the switch and the gRPC code.

:class:`SwitchUnreachableError` (no answer, or the connection dropped during the call: its
answer is discarded), :class:`NotMasterError`, :class:`NoPipelineError` (the switch runs no
pipeline: it restarted), :class:`WriteError` (updates the switch rejected, one
:class:`UpdateError` each) and :class:`P4RuntimeCallError` (anything else). A caller that
keeps running through a switch's trouble catches the base class.
"""

from __future__ import annotations

from dataclasses import dataclass


class P4RuntimeError(Exception):
    """A P4Runtime call to a switch failed; ``code`` is the gRPC status name, ``address`` the switch."""

    def __init__(self, message: str, code: str = "UNKNOWN", address: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.address = address


class SwitchUnreachableError(P4RuntimeError, ConnectionError):
    """The switch did not answer, or the connection dropped during the call (its answer was discarded)."""


class NotMasterError(P4RuntimeError, PermissionError):
    """This controller lost (or never won) arbitration: another has a higher election id."""


class NoPipelineError(P4RuntimeError):
    """The switch runs no forwarding pipeline (FAILED_PRECONDITION): it restarted and nobody pushed one yet."""


class P4RuntimeCallError(P4RuntimeError):
    """The switch refused a call for another reason (the message has the gRPC code and details)."""


@dataclass(frozen=True)
class UpdateError:
    """Why the switch rejected one update of a batch."""

    index: int
    update: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"#{self.index} {self.update}: {self.code}: {self.message}"


class WriteError(P4RuntimeError, RuntimeError):
    """The switch rejected some updates of a write; ``errors`` has one UpdateError per rejected update."""

    def __init__(self, address: str, total: int, errors: list[UpdateError]) -> None:
        self.errors = errors
        lines = "\n  ".join(str(e) for e in errors)
        super().__init__(f"switch {address} rejected {len(errors)} of {total} update(s):\n  {lines}",
                         errors[0].code if errors else "UNKNOWN", address)

    @property
    def codes(self) -> list[str]:
        """Status code names of the rejected updates, in batch order."""
        return [e.code for e in self.errors]
