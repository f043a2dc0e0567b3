"""A Grafana dashboard drawn without Grafana: each panel's PromQL run against Prometheus' HTTP API.

Grafana is not packaged here (Prometheus is, in Debian), so ``scripts/render_dashboard.py``
and ``kvpool demo --observe`` draw ``deploy/grafana/kvpool.json`` themselves: for every
``timeseries`` panel, every target's ``expr`` goes to ``/api/v1/query_range`` over the chosen
window, with Grafana's ``$__rate_interval`` replaced as Grafana computes it (the larger of
the step plus one scrape interval and four scrape intervals), and each series is labelled
by the target's ``legendFormat``. Panels keep the dashboard's grid (24 columns), titles,
rows and units; matplotlib draws them into one PNG. Only what the dashboard uses is
understood: ``timeseries`` and ``row`` panels, ``{{label}}`` legends, the units
``percentunit``, ``Bps``, ``pps``, ``s`` and ``short``.

``prometheus`` runs a Prometheus from PATH (Debian's ``prometheus`` package) on a
configuration and a storage directory, for the demo or to read a stored run again.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpool.tcp import free_port

Query = Callable[[str, float, float, float], list[dict[str, Any]]]
"""``(expr, start, end, step) -> result``: Prometheus' ``data.result`` of a range query."""


@dataclass
class Series:
    """One line of a panel: its legend and its points (NaN where Prometheus had none)."""

    legend: str
    times: list[float]
    values: list[float]


@dataclass
class Panel:
    """A panel as drawn: grid position, title, unit and the series its targets gave."""

    kind: str  # "timeseries" or "row"
    title: str
    grid: dict[str, int]
    unit: str = "short"
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def rate_interval(step_s: float, scrape_s: float) -> str:
    """Grafana's ``$__rate_interval``: max(step + scrape interval, 4 x scrape interval), in whole seconds."""
    return f"{math.ceil(max(step_s + scrape_s, 4 * scrape_s))}s"


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """A ``legendFormat`` with its ``{{label}}`` parts filled in (absent labels empty)."""
    out = fmt
    while "{{" in out and "}}" in out.split("{{", 1)[1]:
        before, rest = out.split("{{", 1)
        name, after = rest.split("}}", 1)
        out = before + labels.get(name.strip(), "") + after
    return out


def prometheus_query(base_url: str, timeout_s: float = 30.0) -> Query:
    """A ``Query`` against the Prometheus at ``base_url`` (``ValueError`` with its error text if it refuses)."""

    def query(expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": f"{step:g}"})
        url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: Prometheus says why in its JSON
            doc = json.loads(exc.read() or b"{}")
        if doc.get("status") != "success":
            raise ValueError(f"{doc.get('errorType', 'error')}: {doc.get('error', 'no answer')}")
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    return query


def evaluate(dashboard: dict[str, Any], query: Query, start: float, end: float, step_s: float,
             scrape_s: float) -> list[Panel]:
    """Every panel of ``dashboard`` with its series over ``[start, end]``; a target that fails is noted, not fatal."""
    window = rate_interval(step_s, scrape_s)
    panels: list[Panel] = []
    for p in dashboard.get("panels", []):
        kind = p.get("type", "")
        if kind not in ("timeseries", "row"):
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        panel = Panel(kind, p.get("title", ""), dict(p.get("gridPos", {})), unit)
        for target in p.get("targets", []):
            expr = target.get("expr", "").replace("$__rate_interval", window)
            try:
                result = query(expr, start, end, step_s)
            except (ValueError, OSError) as exc:
                panel.errors.append(f"{target.get('refId', '?')}: {exc}")
                continue
            for item in result:
                times = [float(t) for t, _ in item.get("values", [])]
                values = [_number(v) for _, v in item.get("values", [])]
                panel.series.append(Series(legend(target.get("legendFormat", ""), item.get("metric", {}))
                                           or expr[:60], times, values))
        panels.append(panel)
    return panels


def _number(text: str) -> float:
    try:
        return float(text)  # Prometheus writes NaN, +Inf and -Inf as such
    except ValueError:
        return math.nan


def _axis_format(unit: str) -> Callable[[float, Any], str]:
    def si(v: float, suffix: str) -> str:
        for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:g}{prefix}{suffix}"
        return f"{v:g}{suffix}"

    formats: dict[str, Callable[[float, Any], str]] = {
        "percentunit": lambda v, _pos: f"{v * 100:g}%",
        "Bps": lambda v, _pos: si(v, "B/s"),
        "pps": lambda v, _pos: si(v, " p/s"),
        "s": lambda v, _pos: f"{v * 1000:g} ms" if 0 < abs(v) < 1 else f"{v:g} s",
    }
    return formats.get(unit, lambda v, _pos: si(v, ""))


def draw(panels: list[Panel], path: Path, title: str, caption: str, start: float, end: float,
         marks: Sequence[tuple[float, str]] = ()) -> None:
    """Draw ``panels`` on the dashboard's grid into a PNG at ``path`` (matplotlib, no display).

    ``marks``: ``(time, label)`` of moments to show on every panel (a demo's modes, say), as
    Grafana draws annotations: a dotted line, the label at its top.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = max((pn.grid.get("y", 0) + pn.grid.get("h", 1) for pn in panels), default=1)
    fig = plt.figure(figsize=(16, 0.42 * rows + 1.6), dpi=110)
    grid = fig.add_gridspec(rows, 24, left=0.05, right=0.98, top=1 - 0.9 / (0.42 * rows + 1.6),
                            bottom=0.7 / (0.42 * rows + 1.6), hspace=0.0, wspace=0.0)
    for pn in panels:
        x, y, w, h = (pn.grid.get(k, d) for k, d in (("x", 0), ("y", 0), ("w", 24), ("h", 1)))
        if pn.kind == "row":
            ax = fig.add_subplot(grid[y : y + h, x : x + w])
            ax.axis("off")
            ax.text(0, 0.2, pn.title, fontsize=13, fontweight="bold", transform=ax.transAxes)
            continue
        # A little margin inside the cell for the title and the tick labels.
        ax = fig.add_subplot(grid[y + 1 : y + h - 1, x + 1 : x + w - 1] if h > 3 else grid[y : y + h, x : x + w])
        ax.set_title(pn.title, fontsize=10, loc="left")
        drawn = 0
        for s in pn.series:
            if any(not math.isnan(v) for v in s.values):
                ax.plot([t - start for t in s.times], s.values, label=s.legend, linewidth=1.2)
                drawn += 1
        ax.set_xlim(0, max(1.0, end - start))
        for t, label in marks:
            ax.axvline(t - start, color="grey", linestyle=":", linewidth=1)
            ax.annotate(label, (t - start, 1), xycoords=("data", "axes fraction"), xytext=(2, -9),
                        textcoords="offset points", fontsize=7, color="dimgrey")
        ax.yaxis.set_major_formatter(FuncFormatter(_axis_format(pn.unit)))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.set_xlabel("seconds into the run", fontsize=7)
        if drawn:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if drawn > 4 else 1, framealpha=0.6)
        else:
            why = "; ".join(pn.errors)[:120] if pn.errors else "no data"
            ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes)
    span = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
    fig.suptitle(f"{title}  ({span}, {end - start:.0f} s)", fontsize=14, x=0.05, ha="left")
    fig.text(0.05, 0.2 / (0.42 * rows + 1.6), caption, fontsize=8, color="dimgrey", ha="left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def render(dashboard_path: Path, query: Query, out: Path, start: float, end: float, *, step_s: float = 2.0,
           scrape_s: float = 5.0, caption: str = "", marks: Sequence[tuple[float, str]] = ()) -> list[Panel]:
    """Evaluate and draw the dashboard at ``dashboard_path`` into ``out``; the panels drawn."""
    dashboard = json.loads(dashboard_path.read_text())
    panels = evaluate(dashboard, query, start, end, step_s, scrape_s)
    draw(panels, out, dashboard.get("title", dashboard_path.stem), caption, start, end, marks)
    return panels


NO_PROMETHEUS = "prometheus is not on PATH (Debian: apt-get install -y prometheus)"
"""The one-line error when Prometheus is missing."""


@contextlib.contextmanager
def prometheus(config: Path, storage: Path, log: Path, ready_s: float = 60.0) -> Iterator[str]:
    """Run ``prometheus`` from PATH on ``config``, keeping its data in ``storage``; yields its base URL.

    Listens on a free loopback port; keeps what it stores (no retention limit), so a run can
    be drawn again later. ``RuntimeError`` (``NO_PROMETHEUS``, or why it did not start).
    """
    exe = shutil.which("prometheus")
    if exe is None:
        raise RuntimeError(NO_PROMETHEUS)
    url = f"http://127.0.0.1:{free_port()}"
    storage.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen([exe, f"--config.file={config}", f"--storage.tsdb.path={storage}",
                                 "--storage.tsdb.retention.time=100y", f"--web.listen-address={url[7:]}"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode} (log: {log})")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {ready_s:.0f} s (log: {log})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
