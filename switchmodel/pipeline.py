"""The kvpool P4 program (p4/, v1model) executed in Python, packet by packet: ``V1Switch`` wiring.

``KvpoolPipeline.process(ingress_port, frame)`` runs one frame through the same stages,
in the same order and with the same arithmetic as ``p4/kvpool.p4`` on BMv2's
``simple_switch``: parser -> verify checksum -> ingress -> packet replication -> egress
(per copy) -> compute checksum -> deparser.  Like ``p4/kvpool.p4``, this module only
wires; the model mirrors the program file for file:

==========================  ==================================
``p4/include/``             ``switchmodel/``
==========================  ==================================
headers, parser, deparser   :mod:`~switchmodel.parser`
checksum                    :mod:`~switchmodel.checksum`
safety                      :mod:`~switchmodel.safety`
pool                        :mod:`~switchmodel.pool`
popularity                  :mod:`~switchmodel.popularity`
coalesce (both halves)      :mod:`~switchmodel.coalesce`
forwarding                  :mod:`~switchmodel.forwarding`
ingress                     :mod:`~switchmodel.ingress`
egress                      :mod:`~switchmodel.egress`
``<v1model.p4>`` externs    :mod:`~switchmodel.v1model`
hash algorithms (BMv2)      :mod:`~switchmodel.hashes`
==========================  ==================================

Tables, counters, registers, digests and groups live in :class:`switchmodel.state.SwitchState`
by P4Info name, so a controller programs the model and BMv2 with the same messages;
``switchmodel/DIFFERENCES.md`` lists the known differences from BMv2.

v1model details reproduced on purpose (they decide which packets come out):

* a parser error does not drop by itself; ingress sees ``parser_error`` and drops;
* user metadata, locals and standard metadata start at 0 for every packet;
* ``mark_to_drop`` sets ``egress_spec`` to 511 *and* ``mcast_grp`` to 0;
* a non-zero ``mcast_grp`` wins over ``egress_spec``; each replica carries a copy of the
  headers and user metadata and its own ``egress_rid``; an unknown group replicates to
  nothing;
* out-of-range register reads leave the destination unchanged; out-of-range writes and
  counter updates do nothing (BMv2 logs and skips them);
* ``hash`` is ``base + algo(bytes) % max`` over the MSB-first packed fields (BMv2's CRCs);
* the deparser emits the valid headers, then the bytes the parser did not consume.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kvpool import contract
from switchmodel.checksum import ipv4_csum16
from switchmodel.egress import Egress
from switchmodel.ingress import Ingress
from switchmodel.parser import Meta, Packet, parse
from switchmodel.state import StateError, SwitchState
from switchmodel.v1model import BMV2_HEADROOM, DROP_PORT, M48, Externs

log = logging.getLogger(__name__)

REQUIRED_NAMES: Final = tuple(n for n in contract.all_names() if n != ("action", contract.NO_ACTION))
"""Every P4Info object the pipeline touches; a pipeline config lacking one is not kvpool."""


@dataclass
class PipelineStats:
    """What happened to frames in the model, beyond the P4 counters (for status and benches)."""

    frames_in: int = 0
    frames_out: int = 0
    dropped_no_pipeline: int = 0
    dropped_ingress: int = 0
    dropped_egress: int = 0
    replicas: int = 0
    beyond_bmv2_headroom: int = 0
    """Frames sent larger than their ingress length + 512 bytes: BMv2 cannot build them."""


def default_clock_us() -> Callable[[], int]:
    """A 48-bit microsecond clock starting near 0, like ``ingress_global_timestamp`` on BMv2."""
    start = time.monotonic_ns()
    return lambda: ((time.monotonic_ns() - start) // 1000) & M48


class KvpoolPipeline:
    """Runs frames through the kvpool program against a :class:`SwitchState`."""

    def __init__(self, state: SwitchState, clock_us: Callable[[], int] | None = None) -> None:
        """``clock_us`` gives ``ingress_global_timestamp``; tests may pass a fake one."""
        self.state = state
        self.clock_us = clock_us or default_clock_us()
        self.stats = PipelineStats()
        self._ready: bool | None = None
        self._ready_generation = -1
        self._lock = threading.Lock()
        self.externs = Externs(state)
        self.ingress = Ingress(self.externs)
        self.egress = Egress(self.externs)

    # --- pipeline checks ---------------------------------------------------------------------

    def ready(self) -> bool:
        """True when a pipeline is committed and its P4Info has every object this model runs."""
        gen = self.state.generation
        if gen != self._ready_generation:
            self._ready_generation = gen
            pipe = self.state.pipeline
            if pipe is None:
                self._ready = False
            else:
                missing = [f"{kind} {name}" for kind, name in REQUIRED_NAMES if not pipe.p4info.has(kind, name)]
                if missing:
                    log.error("pipeline is not kvpool: P4Info lacks %s; dropping every packet",
                              ", ".join(missing[:5]))
                self._ready = not missing
                if self._ready:
                    self.externs.bind(pipe.p4info)
        return bool(self._ready)

    # --- top level ---------------------------------------------------------------------------

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Run one frame received on ``ingress_port``; return ``(egress_port, frame)`` for each copy sent."""
        with self._lock:
            self.stats.frames_in += 1
            if not self.ready():
                # Like simple_switch_grpc before SetForwardingPipelineConfig: nothing forwards.
                self.stats.dropped_no_pipeline += 1
                return []
            try:
                out = self._process(ingress_port, frame)
            except StateError as exc:
                # The pipeline changed under this packet (e.g. a reload between lookups).
                log.warning("packet dropped, state changed while processing: %s", exc.message)
                self.stats.dropped_no_pipeline += 1
                return []
            self.stats.frames_out += len(out)
            return out

    def _process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        pkt = parse(frame)  # MyParser
        meta = Meta(ingress_port=ingress_port, ingress_timestamp=self.clock_us() & M48, packet_length=len(frame))
        # MyVerifyChecksum, then MyIngress.
        checksum_error = pkt.ipv4 is not None and pkt.ipv4.ihl == 5 and ipv4_csum16(pkt.ipv4) != pkt.ipv4.checksum
        self.ingress.apply(pkt, meta, checksum_error)

        # Packet replication engine / unicast (simple_switch ingress_thread).
        copies: list[tuple[Packet, Meta]]
        if meta.mcast_grp != 0:
            copies = []
            for replica in self.state.multicast_group(meta.mcast_grp):
                m = meta.copy()
                m.egress_port = replica.port
                m.egress_rid = replica.rid
                copies.append((pkt.copy(), m))
            self.stats.replicas += len(copies)
        elif meta.egress_spec == DROP_PORT:
            self.stats.dropped_ingress += 1
            return []
        else:
            meta.egress_port = meta.egress_spec
            meta.egress_rid = 0
            copies = [(pkt, meta)]

        out: list[tuple[int, bytes]] = []
        for p, m in copies:
            # simple_switch initialises egress_spec to a value other than the drop port.
            m.egress_spec = DROP_PORT + 1
            self.egress.apply(p, m)  # MyEgress
            if m.egress_spec == DROP_PORT:
                self.stats.dropped_egress += 1
                continue
            if p.ipv4 is not None and p.ipv4.ihl == 5:
                # MyComputeChecksum.
                p.ipv4.checksum = ipv4_csum16(p.ipv4)
            data = p.deparse()  # MyDeparser
            if len(data) > len(frame) + BMV2_HEADROOM:
                # BMv2 overruns its packet buffer here (and crashes); the model sends the
                # frame the P4 program describes and says so (switchmodel/DIFFERENCES.md).
                self.stats.beyond_bmv2_headroom += 1
                if self.stats.beyond_bmv2_headroom == 1:
                    log.warning("a %d-byte frame grew to %d bytes: more than BMv2's %d bytes of headroom",
                                len(frame), len(data), BMV2_HEADROOM)
            out.append((m.egress_port, data))
        return out
