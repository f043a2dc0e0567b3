"""Draw the Grafana dashboard (deploy/grafana/kvpool.json) from its own queries against a Prometheus, into a PNG.

Grafana is not packaged here; this evaluates each panel's PromQL with Prometheus' range
API and draws the panels with matplotlib (``kvpool.dashboard``). The data comes from a
running Prometheus (``--prometheus URL``) or from one this starts on the storage a run left
behind (``--tsdb DIR``, e.g. ``OUT/observe/tsdb`` of ``kvpool demo --observe``, whose
``window.json`` beside it gives the run's time span and scrape interval).

    python scripts/render_dashboard.py --tsdb results/demo/observe/tsdb --out docs/guide/img/dashboard.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvpool import dashboard

REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="a running Prometheus, e.g. http://127.0.0.1:9090")
    src.add_argument("--tsdb", type=Path, metavar="DIR", help="a Prometheus storage directory to read (starts a "
                     "prometheus from PATH on it)")
    p.add_argument("--dashboard", type=Path, default=REPO / "deploy" / "grafana" / "kvpool.json")
    p.add_argument("--window", type=Path, help="JSON with start, end (Unix seconds), scrape_s and marks "
                   "([time, label] pairs drawn on every panel) (default: window.json beside --tsdb)")
    p.add_argument("--start", type=float, help="start of the span drawn, Unix seconds")
    p.add_argument("--end", type=float, help="end of the span drawn, Unix seconds (default now)")
    p.add_argument("--last", type=float, default=1800, help="without a start: the last N seconds (default 1800)")
    p.add_argument("--scrape-interval", type=float, help="the scrape interval, seconds (for $__rate_interval; "
                   "default the window file's, else 5)")
    p.add_argument("--step", type=float, help="seconds between points (default: span / 240, at least the scrape "
                   "interval)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "guide" / "img" / "dashboard.png")
    p.add_argument("--caption", help="text under the panels (default: this command line)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Render; 0 on success, 1 when Prometheus is missing or refuses."""
    args = build_parser().parse_args(argv)
    window: dict[str, Any] = {}
    window_file = args.window or (args.tsdb.parent / "window.json" if args.tsdb else None)
    if window_file is not None and window_file.exists():
        window = json.loads(window_file.read_text())
    end = args.end or window.get("end") or time.time()
    start = args.start or window.get("start") or end - args.last
    scrape = args.scrape_interval or window.get("scrape_s") or 5.0
    step = args.step or max(scrape, (end - start) / 240)
    shown = argv if argv is not None else sys.argv[1:]
    caption = args.caption or ("rendered from the dashboard's own PromQL by: python scripts/render_dashboard.py "
                               + shlex.join(shown))
    try:
        with contextlib.ExitStack() as stack:
            url = args.prometheus
            if url is None:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvpool-render-")))
                (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
                url = stack.enter_context(dashboard.prometheus(tmp / "prometheus.yml", args.tsdb.resolve(),
                                                               tmp / "prometheus.log"))
            panels = dashboard.render(args.dashboard, dashboard.prometheus_query(url), args.out, start, end,
                                      step_s=step, scrape_s=scrape, caption=caption,
                                      marks=[(float(t), str(label)) for t, label in window.get("marks", [])])
    except (RuntimeError, OSError) as exc:
        print(f"render_dashboard: {exc}", file=sys.stderr)
        return 1
    drawn = [p for p in panels if p.kind == "timeseries"]
    empty = [p.title for p in drawn if not p.series]
    print(f"render_dashboard: {args.out}: {len(drawn)} panels over {end - start:.0f} s"
          + (f"; no data in: {', '.join(empty)}" if empty else ""))
    for p in drawn:
        for err in p.errors:
            print(f"render_dashboard: {p.title}: {err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
