"""The v1model architecture as BMv2's ``simple_switch`` runs it: drop port, externs, out-of-range rules.

What the P4 program gets from ``<v1model.p4>`` rather than from ``p4/include/``:
``mark_to_drop``, and register and counter externs with BMv2's behaviour for an index out
of range (a read leaves the destination unchanged, a write or count does nothing), over
the live arrays of a :class:`~switchmodel.state.SwitchState`.  Tables and digests go to
the state itself (``lookup``, ``emit_digest``).
"""

from __future__ import annotations

from typing import Final

from kvpool.p4rt.p4info import P4Info
from switchmodel.parser import Meta
from switchmodel.state import SwitchState

DROP_PORT: Final = 511
"""v1model's drop port on BMv2 (``egress_spec == 511`` drops)."""
BMV2_HEADROOM: Final = 512
"""Bytes a packet may grow by in BMv2's simple_switch (its buffer is ingress length + 512)."""

M32: Final = 0xFFFFFFFF
M48: Final = (1 << 48) - 1


def mark_to_drop(meta: Meta) -> None:
    """v1model ``mark_to_drop``: drop port as egress_spec and no multicast."""
    meta.egress_spec = DROP_PORT
    meta.mcast_grp = 0


class Externs:
    """Registers, counters, tables and digests of one switch, as the controls of the program see them."""

    def __init__(self, state: SwitchState) -> None:
        self.state = state
        # Live register and counter arrays of the committed pipeline (re-fetched by bind).
        self._regs: dict[str, list[int]] = {}
        self._reg_mask: dict[str, int] = {}
        self._ctrs: dict[str, list[list[int]]] = {}

    def bind(self, p4info: P4Info) -> None:
        """Fetch the arrays of a newly committed pipeline (the state re-creates them on commit)."""
        self._regs = {r.name: self.state.register_cells(r.name) for r in p4info.registers}
        self._reg_mask = {r.name: (1 << r.bitwidth) - 1 for r in p4info.registers}
        self._ctrs = {c.name: self.state.counter_cells(c.name) for c in p4info.counters}

    def read(self, reg: str, index: int, current: int = 0) -> int:
        """``register.read``: out of range leaves the destination as it was."""
        cells = self._regs[reg]
        return cells[index] if 0 <= index < len(cells) else current

    def write(self, reg: str, index: int, value: int) -> None:
        """``register.write``, cut to the cell width; out of range writes nothing."""
        cells = self._regs[reg]
        if 0 <= index < len(cells):
            cells[index] = value & self._reg_mask[reg]

    def count(self, ctr: str, index: int, meta: Meta) -> None:
        """``counter.count`` (packets; bytes kept too, as BMv2 does): out of range counts nothing."""
        cells = self._ctrs[ctr]
        if 0 <= index < len(cells):
            cell = cells[index]
            cell[0] += 1
            cell[1] += meta.packet_length


class Control:
    """A P4 control of the program: tables and digests through the state, registers and counters through the externs."""

    def __init__(self, ext: Externs) -> None:
        self.state = ext.state
        # Bound once: the packet path calls these for every register and counter access.
        self._read = ext.read
        self._write = ext.write
        self._count = ext.count
