"""``kvpool demo --observe``: Prometheus beside the demo, and its dashboard drawn from the run.

A Prometheus from PATH (Debian's ``prometheus``; Grafana is not packaged here) scrapes, every
``SCRAPE_S`` seconds, the jobs of ``deploy/prometheus/prometheus.yml``:

* ``kvpool-agent``: every agent. They live in Mininet hosts (other network namespaces) and
  serve their API on Unix sockets in the run directory, which Prometheus cannot scrape; a
  loopback proxy per agent (``_UnixMetrics``) answers ``/metrics`` from the agent's socket.
  The series carry ``instance`` = the host's name and its ``role``.
* ``kvpool-controller``: the controller of the mode running, served by a ``ControllerAPI`` on
  one loopback port for the whole run (a gap between modes, as a controller restart makes).
* ``kvpool-switch``: each model switch's own ``--metrics`` (BMv2 has none; its counters are
  the controller's).

At the end the dashboard (``deploy/grafana/kvpool.json``) is drawn from its own queries over
the run (``kvpool.dashboard``) into ``OUT/observe/dashboard.png``; Prometheus' data stays in
``OUT/observe/tsdb`` with ``window.json`` beside it, for ``scripts/render_dashboard.py``.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.api import ControllerAPI
from kvpool import dashboard
from kvpool.auth import Token
from kvpool.http_api import ApiError
from kvpool.http_client import JsonClient
from kvpool.tcp import free_port

if TYPE_CHECKING:
    from controller.daemon import Controller

SCRAPE_S = 2.0
"""Scrape interval: a demo mode lasts tens of seconds; the controller reads every switch per scrape."""
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvpool.json"


class _UnixMetrics:
    """``GET /metrics`` on a loopback port, answered from an agent API's Unix socket."""

    def __init__(self, api: str) -> None:
        client = JsonClient(api, 10, "agent API")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                try:
                    reply = client.request("GET", "/metrics", headers={"Accept": self.headers.get("Accept", "*/*")})
                except ApiError as exc:
                    self.send_error(503, str(exc)[:200])
                    return
                self.send_response(200)
                self.send_header("Content-Type", reply.header("Content-Type") or "text/plain")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: Prometheus asks every few seconds."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"metrics-proxy-{api}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop answering."""
        self.server.shutdown()
        self.server.server_close()


def scrape_config(agents: dict[str, tuple[str, str]], controller: str, switches: dict[str, str]) -> dict[str, Any]:
    """Prometheus' configuration (JSON is YAML): agents ``name -> (address, role)``, the controller's
    address, model switches ``name -> address``; every target's ``instance`` is its name."""
    def job(name: str, targets: dict[str, tuple[str, dict[str, str]]]) -> dict[str, Any]:
        return {"job_name": name, "metrics_path": "/metrics", "scrape_timeout": f"{SCRAPE_S:g}s",
                "static_configs": [{"targets": [addr], "labels": {"instance": inst, **labels}}
                                   for inst, (addr, labels) in sorted(targets.items())]}

    jobs = [job("kvpool-controller", {"controller": (controller, {})}),
            job("kvpool-agent", {h: (addr, {"role": role}) for h, (addr, role) in agents.items()})]
    if switches:
        jobs.append(job("kvpool-switch", {s: (addr, {}) for s, addr in switches.items()}))
    interval = f"{SCRAPE_S:g}s"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}


class Observer:
    """Prometheus and the dashboard for one ``Testbed`` run (``Testbed.observer``)."""

    def __init__(self, out: Path, command: list[str]) -> None:
        self.dir = out
        self.command = command
        self.controller_port = 0
        self.token: Token | None = None
        self.dashboard: Path | None = None
        """The PNG drawn at the end of the run (None until then, or when drawing failed)."""
        self.marks: list[tuple[float, str]] = []
        """When each mode's controller started, and the mode: drawn on every panel."""

    @contextlib.contextmanager
    def watching(self, agents: dict[str, tuple[str, str]], switches: dict[str, str], token: Token) -> Iterator[None]:
        """While the run's agents (``name -> (API address, role)``) and model switches (``name -> metrics
        address``) run: Prometheus scraping them; the dashboard drawn after. ``token``: the agents' and
        the controller's."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.controller_port = free_port()
        proxies = {name: _UnixMetrics(api) for name, (api, _role) in agents.items()}
        try:
            config = scrape_config({n: (p.address, agents[n][1]) for n, p in proxies.items()},
                                   f"127.0.0.1:{self.controller_port}", switches)
            (self.dir / "prometheus.yml").write_text(json.dumps(config, indent=1) + "\n")
            with dashboard.prometheus(self.dir / "prometheus.yml", self.dir / "tsdb", self.dir / "prometheus.log") \
                    as url:
                print(f"kvpool demo: Prometheus at {url} (data in {self.dir / 'tsdb'})", file=sys.stderr)
                start = time.time()
                yield
                time.sleep(2 * SCRAPE_S)  # the last counters scraped
                end = time.time()
                self._draw(url, start, end)
        finally:
            for proxy in proxies.values():
                proxy.close()

    def _draw(self, url: str, start: float, end: float) -> None:
        window = {"start": start, "end": end, "scrape_s": SCRAPE_S, "marks": self.marks}
        (self.dir / "window.json").write_text(json.dumps(window) + "\n")
        out = self.dir / "dashboard.png"
        caption = (f"{shlex.join(self.command)}: deploy/grafana/kvpool.json drawn from its own PromQL over "
                   "Prometheus' data of the run (kvpool/dashboard.py; Grafana is not packaged here); dotted: "
                   "each mode's start")
        try:
            dashboard.render(DASHBOARD, dashboard.prometheus_query(url), out, start, end,
                             step_s=max(SCRAPE_S, (end - start) / 240), scrape_s=SCRAPE_S, caption=caption,
                             marks=self.marks)
        except (ImportError, OSError, ValueError) as exc:
            print(f"kvpool demo: the dashboard was not drawn: {exc}", file=sys.stderr)
            return
        self.dashboard = out

    @contextlib.contextmanager
    def controller(self, ctl: Controller) -> Iterator[None]:
        """While ``ctl`` runs a mode: its API (and ``/metrics``) on the run's controller port."""
        self.marks.append((time.time(), ctl.settings.mode.value))
        api = ControllerAPI(ctl, "127.0.0.1", self.controller_port, token=self.token).start()
        try:
            yield
        finally:
            api.stop()
