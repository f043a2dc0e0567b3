"""The model's data plane as ``kvpool-switch`` runs it: pipeline + ports from CLI options.

``--interface 1@s1-eth1 --interface 2@s1-eth2`` (or ``-i``) binds switch ports to Linux
interfaces like simple_switch's ``-i``; the pipeline runs every frame read from them
against the switch state the P4Runtime server writes.  ``--impair`` and ``--impair-file``
impair the ports' links (``switchmodel.impair``), which the model can do and BMv2 cannot.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from switchmodel.impair import Impairer, ImpairFile, ImpairSpec, parse_specs
from switchmodel.pipeline import KvpoolPipeline
from switchmodel.ports import PortError, PortIO, PortSpec, check_unique, disable_offloads
from switchmodel.state import SwitchState

log = logging.getLogger(__name__)


_PORTS_LINE = re.compile(r"ports: \d+ frames in, \d+ out; (\d+) not sent \(socket buffer full\), (\d+) dropped")


def frames_lost(log_text: str) -> int:
    """Frames a model switch lost at its ports (not sent, or dropped before read), from its log; 0 if none logged.

    Summed over every stop the log records (a restarted switch appends to it).
    """
    return sum(int(m[1]) + int(m[2]) for m in _PORTS_LINE.finditer(log_text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the packet-I/O options on ``parser``."""
    parser.add_argument("-i", "--interface", action="append", default=[], metavar="PORT@IFNAME",
                        help="bind switch port PORT to Linux interface IFNAME (repeat per port), "
                             "like simple_switch's -i; e.g. -i 1@s1-eth1 -i 2@s1-eth2")
    parser.add_argument("--keep-offloads", action="store_true",
                        help="leave checksum/segmentation offloads on the interfaces as they are "
                             "(default: turn them off, as BMv2 setups must)")
    parser.add_argument("--impair", action="append", default=[], metavar="PORT:DIR:K=V,...",
                        help="impair frames of a port (or * for all) in direction in, out or both; keys "
                             "loss, dup, reorder, delay_ms, corrupt (probabilities, delay in ms) and seed; "
                             "repeatable; e.g. --impair 2:in:loss=0.1,seed=7")
    parser.add_argument("--impair-file", type=Path, metavar="PATH",
                        help="while this file exists, its specs (one per line) replace --impair; "
                             "rewrite it to change them at run time, an empty file stops all impairment")


def port_specs(args: argparse.Namespace) -> list[PortSpec]:
    """The ``--interface`` options as port specs; ``ValueError`` with a one-line message if bad."""
    specs = [PortSpec.parse(text) for text in args.interface]
    check_unique(specs)
    return specs


def impair_specs(args: argparse.Namespace) -> list[ImpairSpec]:
    """The ``--impair`` options as specs; ``ValueError`` with a one-line message if one is bad."""
    return parse_specs(args.impair)


@dataclass
class DataPlane:
    """A running pipeline and, if any interfaces were given, its port loop."""

    pipeline: KvpoolPipeline
    ports: PortIO | None

    def stop(self) -> None:
        """Stop the port loop and close the sockets (logging what the impairment did, if any)."""
        if self.ports is not None:
            self.ports.close()
            st = self.ports.stats
            lost = st.tx_errors + st.rx_kernel_drops
            log.log(logging.WARNING if lost else logging.INFO,
                    "ports: %d frames in, %d out; %d not sent (socket buffer full), %d dropped by the kernel "
                    "before the loop read them %s", st.rx_frames, st.tx_frames, st.tx_errors, st.rx_kernel_drops,
                    st.per_port_kernel_drops or "")
            if self.ports.impairer is not None:
                log.warning("impairment counters: %s", self.ports.impairer.stats())


def start(state: SwitchState, specs: Sequence[PortSpec], keep_offloads: bool = False,
          impair: Sequence[ImpairSpec] = (), impair_file: Path | None = None) -> DataPlane:
    """Build the pipeline on ``state`` and start forwarding between ``specs``; ``PortError`` if one fails.

    ``impair`` and ``impair_file`` impair the ports' links (see ``switchmodel.impair``).
    """
    pipeline = KvpoolPipeline(state)
    if not specs:
        return DataPlane(pipeline, None)
    if not keep_offloads:
        for spec in specs:
            disable_offloads(spec.ifname)
    watcher = ImpairFile(impair_file, impair) if impair_file is not None else None
    impairer = Impairer(impair) if impair or watcher is not None else None
    if impair:
        log.warning("impairing links: %s", "; ".join(map(str, impair)))
    ports = PortIO(specs, pipeline, impairer=impairer, impair_file=watcher)
    try:
        ports.open()
    except PortError:
        ports.close()
        raise
    ports.start()
    log.info("forwarding between %s", ", ".join(f"{s.port}@{s.ifname}" for s in specs))
    return DataPlane(pipeline, ports)
