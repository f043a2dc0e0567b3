"""The model switch's own counters for Prometheus: its port loop and its link impairments (``--metrics``).

The P4 program's counters (drops, pool, coalescing, popularity, egress) are the controller's
to export: it reads them over P4Runtime from any target, BMv2 or this model, as
``kvpool_switch_*`` with a ``switch`` label. What only the model knows is here, as
``kvpool_model_*``: frames and bytes through its ports, frames it could not send or process,
frames the kernel dropped before its loop read them, and what ``--impair`` did to each
channel. The same ``PortStats`` and impairment counters the switch logs when it stops, read
at scrape time (``kvpool.metrics``). Names: docs/reference/metrics.md.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server

from kvpool.metrics import Families, SnapshotCollector, registry
from switchmodel.ports import PortIO


def snapshot(ports: PortIO | None) -> dict[str, Any]:
    """The port loop's counters and the impairer's (empty without ports)."""
    if ports is None:
        return {"ports": None, "impair": {}}
    return {"ports": asdict(ports.stats), "impair": ports.impairer.stats() if ports.impairer is not None else {}}


def fill(f: Families, doc: dict[str, Any]) -> None:
    """Every family of one snapshot."""
    f.declare("kvpool_model_port_frames", "Frames through a port of the model, by direction", "port", "direction")
    f.declare("kvpool_model_impair_frames", "Frames an impaired channel saw, by what happened", "channel", "what")
    st = doc["ports"]
    if st is not None:
        for direction, per_port in (("rx", st["per_port_rx"]), ("tx", st["per_port_tx"])):
            for port, n in sorted(per_port.items()):
                f.counter("kvpool_model_port_frames", "Frames through a port of the model, by direction", n,
                          port=str(port), direction=direction)
        f.counter("kvpool_model_bytes", "Bytes through the model's ports, by direction", st["rx_bytes"],
                  direction="rx")
        f.counter("kvpool_model_bytes", "Bytes through the model's ports, by direction", st["tx_bytes"],
                  direction="tx")
        f.counter("kvpool_model_tx_errors", "Frames not sent (a socket buffer was full)", st["tx_errors"])
        f.counter("kvpool_model_process_errors", "Frames the pipeline failed on", st["process_errors"])
        f.counter("kvpool_model_unknown_egress", "Frames sent to a port the model does not have", st["unknown_egress"])
        f.counter("kvpool_model_kernel_drops", "Frames the kernel dropped before the loop read them",
                  st["rx_kernel_drops"])
    for channel, counts in sorted(doc["impair"].items()):
        for what, n in counts.items():
            f.counter("kvpool_model_impair_frames", "Frames an impaired channel saw, by what happened", n,
                      channel=channel, what=what)


def serve(address: str, ports: PortIO | None) -> tuple[CollectorRegistry, WSGIServer]:
    """Serve ``/metrics`` on ``HOST:PORT`` (port 0 picks one) in a daemon thread; the registry and the server."""
    host, _, port = address.rpartition(":")
    reg = registry(SnapshotCollector(lambda: snapshot(ports), fill))
    server, _ = start_http_server(int(port), host or "127.0.0.1", registry=reg)
    return reg, server
