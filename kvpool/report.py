"""Committed results and the docs' tables rendered from them (``kvpool report``).

A result is one JSON file, ``results/NAME.json``: the run's ``commit``, ``date``,
``machine`` and ``command``, a ``kind`` and its ``figures``. A markdown file shows it
between two markers, ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``; ``kvpool
report`` rewrites every such block from its file, ``kvpool report --check`` fails naming
each block that differs from what it would write, and ``kvpool report --add RUN_DIR --as
NAME`` turns a ``kvpool demo`` (or ``scripts/bench_vs_mooncake.py``) results directory into
``results/NAME.json``. So a figure in the docs is either rendered from a file that says where
it came from, or it is prose that names no number a run can change.

Kinds: ``demo`` (one row per mode; per switch where several helped), ``vs_mooncake`` (one
row per N and system) and ``table`` (columns and rows as written: results transcribed from
an older doc, or from a tool that has no reader here yet; ``align`` gives each column's side).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

RESULTS_DIR: Final = "results"
"""Where the committed result files live, under the checkout's root."""
DOC_GLOBS: Final = ("README.md", "docs/**/*.md", "p4/*.md")
"""The markdown files whose report blocks ``kvpool report`` keeps."""
MODES: Final = ("plain", "multicast", "pool")
"""The demo's modes in the order it runs them (``bmv2_topologies.experiment.config.MODES``)."""
KINDS: Final = ("demo", "vs_mooncake", "table")

_BLOCK = re.compile(r"<!-- report:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /report:(?P=name) -->", re.DOTALL)


class ReportError(Exception):
    """A result file or a report block that cannot be read or rendered."""


# ---------------------------------------------------------------------------------- figures
def saved_of_ideal(measured: int, plain_measured: int, ideal: int) -> float | None:
    """The bytes a mode saved against plain (measured) as a fraction of what the ideal saves against plain.

    ``measured`` and ``plain_measured`` are DATA wire bytes, as the ideal is: the GETs on the
    link are not the switch's to save, and counted on one side only they dominate where the
    ideal saves little (the shared conversation trace at 200 requests: the ideal saves 6.3 MB of
    plain's 1,124 MB of DATA, and plain's GETs and NACKs are another 6.2 MB).

    ``(plain_measured - measured) / (plain_measured - ideal)``: 1 is the ideal, 0 no better than
    plain, negative worse.  Against plain's measured bytes, not the bytes asked: agents fetch a
    chunk once for all the requests of a node that want it at the same time, so plain carries
    less than was asked and only the rest is the switch's to save.  None when the ideal saves
    less than 1% of plain's bytes (nothing worth saving: the ratio would be noise).
    """
    if plain_measured <= 0 or plain_measured - ideal < 0.01 * plain_measured:
        return None
    return (plain_measured - measured) / (plain_measured - ideal)


def _git(args: Sequence[str], cwd: Path) -> str | None:
    """``git ARGS`` in ``cwd``, stripped; None where git or the repository is missing."""
    # The experiments run as root in a checkout a user owns: git refuses such a repository
    # ("dubious ownership") unless told it is safe, and reading it is all this does.
    try:
        out = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_info() -> dict[str, Any]:
    """What the numbers ran on: enough to tell two machines apart, nothing secret."""
    return {"cpus": os.cpu_count(), "system": platform.system(), "arch": platform.machine(),
            "release": platform.release(), "python": platform.python_version()}


def run_info(argv: Sequence[str] | None = None, where: Path | None = None) -> dict[str, Any]:
    """The ``run`` object an experiment writes into its results: commit, date, machine, command.

    ``where`` is a path inside the checkout that ran (default: this package's), so the commit
    is the code that produced the figures, with ``dirty`` when it had uncommitted changes.
    """
    where = where or Path(__file__).resolve().parent
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "kvpool"
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return {"commit": _git(["rev-parse", "HEAD"], where), "dirty": bool(status) if status is not None else None,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine_info(), "command": shlex.join([prog, *argv[1:]])}


def _demo_command(doc: Mapping[str, Any]) -> str:
    """A ``kvpool demo`` command line for a results document that recorded none (runs before ``run``)."""
    cfg = doc.get("config", {})
    parts = ["kvpool", "demo", "--target", str(doc.get("target")), "--topology", str(doc.get("topology")),
             "--requesters", str(doc.get("requesters"))]
    if cfg.get("trace"):
        parts += ["--trace", Path(str(cfg["trace"])).name, "--max-requests", str(cfg.get("max_requests")),
                  "--time-scale", f"{cfg.get('time_scale'):g}"]
    if cfg.get("holder_mbps") is not None:
        parts += ["--holder-mbps", f"{cfg['holder_mbps']:g}"]
    return shlex.join(parts)


def demo_figures(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a ``kvpool demo`` ``results.json``: what its table prints, per mode and per switch."""
    cfg = doc.get("config", {})
    modes = [m for m in cfg.get("modes", MODES) if isinstance(doc.get(m), dict)]
    if not modes:
        raise ReportError("no mode in results.json (not a kvpool demo results file?)")
    plain = doc.get("plain")
    rows: dict[str, dict[str, Any]] = {}
    per_switch: dict[str, dict[str, dict[str, int]]] = {}
    for mode in modes:
        s = doc[mode]
        saved = None
        if plain is not None and mode != "plain" and plain.get("holder_data_bytes"):
            saved = saved_of_ideal(s["holder_data_bytes"], plain["holder_data_bytes"], s["ideal_bytes"])
        rows[mode] = {
            "deliver_p50_ms": s["deliver_p50_ms"], "deliver_p99_ms": s["deliver_p99_ms"],
            "holder_mb": round(s["holder_bytes"] / 1e6, 4),
            "vs_plain": round(s["holder_bytes"] / plain["holder_bytes"], 4) if plain and plain["holder_bytes"]
            else None,
            "fabric_mb": round(s.get("fabric_bytes", 0) / 1e6, 4),
            "ideal_mb": round(s["ideal_bytes"] / 1e6, 4),
            "saved_of_ideal": None if saved is None else round(saved, 4),
            "switch_served_fraction": s["switch_served_fraction"],
            "peak_incast": s["peak_concurrent_gets_at_holder"], "requests": s["requests"], "failed": s["failed"],
        }
        per_switch[mode] = {name: {k: c[k] for k in ("absorbed_gets", "served_hits", "fills", "pending_collisions")}
                            for name, c in s.get("switches", {}).items()}
    offered = doc.get("offered", {})
    return {"target": doc.get("target"), "topology": doc.get("topology"), "requesters": doc.get("requesters"),
            "holder_mbps": cfg.get("holder_mbps"),
            "load": round(offered["mean_bps"] / offered["capacity_bps"], 3) if offered.get("capacity_bps") else None,
            "modes": rows, "switches": per_switch if len(doc.get("switches", [])) > 1 else {}}


def vs_mooncake_figures(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a ``scripts/bench_vs_mooncake.py`` ``results.json``: per N, per system."""
    by_n: dict[str, dict[str, dict[str, Any]]] = {}
    for n, systems in doc["by_requesters"].items():
        by_n[n] = {sys_name: {"all_done_p50_ms": s["all_done_p50_ms"], "all_done_p99_ms": s["all_done_p99_ms"],
                              "storage_mb": round(s["storage_link_bytes"] / 1e6, 4),
                              "speedup_vs_mooncake": s.get("speedup_vs_mooncake"),
                              "bytes_vs_mooncake": s.get("bytes_vs_mooncake"),
                              "switch_served_fraction": s["switch_served_fraction"], "failed": s["failed"]}
                   for sys_name, s in systems.items()}
    return {"target": doc.get("target"), "topology": doc.get("topology"), "holder_mbps": doc.get("holder_mbps"),
            "waves": doc.get("waves"), "by_requesters": by_n}


def from_run_dir(run_dir: Path, command: str | None = None, machine: str | None = None) -> dict[str, Any]:
    """A result document from a results directory that ``kvpool demo`` or the side-by-side wrote."""
    path = run_dir / "results.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: {exc}") from exc
    kind = "vs_mooncake" if "by_requesters" in doc else "demo"
    try:
        figures = vs_mooncake_figures(doc) if kind == "vs_mooncake" else demo_figures(doc)
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise ReportError(f"{path}: not a {kind} results file ({exc!r})") from exc
    run = doc.get("run")
    if run is None:
        # Written before results carried their run: the commit checked out now and the file's
        # time are the best there is, and the result says so.
        mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
        run = {**run_info(where=run_dir.resolve()), "date": mtime.isoformat(timespec="seconds"),
               "command": _demo_command(doc) if kind == "demo" else "scripts/bench_vs_mooncake.py",
               "note": "results.json recorded no run: commit is HEAD when added, date the file's mtime"}
    out: dict[str, Any] = {"kind": kind, "command": command or run.get("command"), "commit": run.get("commit"),
                           "dirty": run.get("dirty"), "date": run.get("date"), "machine": dict(run.get("machine", {})),
                           "source": f"kvpool report --add {run_dir}"}
    if machine:
        out["machine"]["description"] = machine
    if run.get("note"):
        out["note"] = run["note"]
    out["figures"] = figures
    return out


def save_table(root: Path, name: str, script: str, argv: Sequence[str], title: str, columns: Sequence[str],
               rows: Sequence[Sequence[str]], notes: Sequence[str], machine: str | None = None,
               summary: Mapping[str, float] | None = None) -> Path:
    """A benchmark's table as ``results/NAME.json`` (the ``table`` kind); the path written.

    ``argv`` are the script's options as run; the command recorded leaves out ``--save`` and
    ``--machine X``, which say where the run goes, not what it measured.
    """
    info = run_info(where=root)
    if machine:
        info["machine"]["description"] = machine
    args = list(argv)
    if "--machine" in args:
        i = args.index("--machine")
        del args[i : i + 2]
    command = shlex.join([script, *(a for a in args if a != "--save")])
    doc: dict[str, Any] = {"kind": "table", "command": command, "commit": info["commit"], "dirty": info["dirty"],
                           "date": info["date"], "machine": info["machine"], "note": " ".join([f"{title}.", *notes])}
    if summary:
        doc["summary"] = {k: round(float(v), 4) for k, v in summary.items()}
    doc["figures"] = {"columns": list(columns), "rows": [list(r) for r in rows]}
    path = root / "results" / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


# ---------------------------------------------------------------------------------- rendering
def _num(value: Any, fmt: str) -> str:
    """``value`` formatted, or ``-`` where the run had no such figure."""
    return "-" if value is None else format(value, fmt)


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, align: str | None = None) -> str:
    """A GitHub markdown table: the first ``left`` columns left-aligned, the others right-aligned.

    ``align``, one letter a column (``l`` or ``r``), overrides ``left``.
    """
    align = align or "l" * left + "r" * (len(head) - left)
    if len(align) != len(head):
        raise ReportError("align names a letter per column")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("--:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _render_demo(fig: Mapping[str, Any]) -> str:
    """The demo's table (as ``kvpool demo`` prints it), then the switches that helped."""
    rows = fig["modes"]
    fabric = any(r.get("fabric_mb") for r in rows.values())  # a star has no link between switches
    head = ["mode", "deliver p50 ms", "deliver p99 ms", "holder MB", "vs plain", *(["fabric MB"] if fabric else []),
            "ideal MB", "saved of ideal", "switch-served", "peak incast", "failed"]
    body = [[mode, _num(r["deliver_p50_ms"], ".1f"), _num(r["deliver_p99_ms"], ".1f"), _num(r["holder_mb"], ".2f"),
             _num(r["vs_plain"], ".3f"), *([_num(r.get("fabric_mb"), ".2f")] if fabric else []),
             _num(r["ideal_mb"], ".2f"), _num(r["saved_of_ideal"], ".2f"), _num(r["switch_served_fraction"], ".1%"),
             _num(r["peak_incast"], "d"), _num(r["failed"], "d")] for mode, r in rows.items()]
    text = _md_table(head, body)
    if fabric:
        per = [[mode, name, str(c["absorbed_gets"]), str(c["served_hits"]), str(c["fills"]),
                str(c["pending_collisions"])]
               for mode, switches in fig["switches"].items() for name, c in switches.items() if any(c.values())]
        text += "\n\nPer switch (those whose counters moved):\n\n" + _md_table(
            ["mode", "switch", "absorbed GETs", "served hits", "fills", "collisions"], per, left=2)
    return text


def _render_vs_mooncake(fig: Mapping[str, Any]) -> str:
    """One row per N and system, against Mooncake Store alone."""
    head = ["N", "system", "all-done p50 ms", "p99 ms", "storage MB", "faster than mooncake", "bytes vs mooncake",
            "switch-served", "failed"]
    body = [[n, system, _num(s["all_done_p50_ms"], ".0f"), _num(s["all_done_p99_ms"], ".0f"),
             _num(s["storage_mb"], ".2f"), _num(s["speedup_vs_mooncake"], ".2f") + ("x" if s["speedup_vs_mooncake"]
                                                                                    is not None else ""),
             _num(s["bytes_vs_mooncake"], ".3f"), _num(s["switch_served_fraction"], ".0%"), _num(s["failed"], "d")]
            for n, systems in fig["by_requesters"].items() for system, s in systems.items()]
    return _md_table(head, body, left=2)


def _render_table(fig: Mapping[str, Any]) -> str:
    """Columns and rows as the file holds them."""
    rows = [[str(c) for c in row] for row in fig["rows"]]
    if any(len(row) != len(fig["columns"]) for row in rows):
        raise ReportError("a row's length differs from the columns'")
    return _md_table(fig["columns"], rows, left=int(fig.get("left", 1)), align=fig.get("align"))


_RENDER: Final[dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "demo": _render_demo, "vs_mooncake": _render_vs_mooncake, "table": _render_table}


def _machine_words(machine: Mapping[str, Any] | str) -> str:
    """The machine in a few words: its description where the result has one."""
    if isinstance(machine, str):  # written by hand: the words themselves
        return machine or "machine not recorded"
    if machine.get("description"):
        return str(machine["description"])
    bits = [f"{machine['cpus']} CPUs" if machine.get("cpus") else "", str(machine.get("arch", ""))]
    return ", ".join(b for b in bits if b) or "machine not recorded"


def render(name: str, result: Mapping[str, Any], results_link: str) -> str:
    """The block for result ``name``: a line saying what produced it, then its table.

    ``results_link`` is the result file's path relative to the markdown file, so the line
    links to the file that holds the commit and the date.
    """
    kind = result.get("kind")
    if kind not in _RENDER:
        raise ReportError(f"{name}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    try:
        table = _RENDER[kind](result["figures"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{name}: figures do not fit kind {kind!r} ({exc!r})") from exc
    source = "transcribed, " if str(result.get("source", "")).startswith("transcribed") else ""
    head = (f"`{result['command']}` on {_machine_words(result.get('machine', {}))} "
            f"({source}[{Path(results_link).name}]({results_link})):")
    return f"{head}\n\n{table}\n"


# ---------------------------------------------------------------------------------- files
@dataclass(frozen=True)
class Block:
    """One report block in one markdown file."""

    path: Path
    name: str
    body: str


def markdown_files(root: Path) -> list[Path]:
    """The markdown files whose report blocks are kept, in a stable order."""
    found = {p for pattern in DOC_GLOBS for p in root.glob(pattern) if p.is_file()}
    return sorted(found)


def blocks(path: Path) -> Iterator[Block]:
    """The report blocks of one markdown file."""
    for m in _BLOCK.finditer(path.read_text()):
        yield Block(path, m["name"], m["body"])


def load_result(root: Path, name: str) -> dict[str, Any]:
    """``results/NAME.json``, checked for the fields every result carries."""
    path = root / RESULTS_DIR / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{name}: {exc}") from exc
    missing = [k for k in ("kind", "command", "commit", "date", "machine", "figures") if k not in doc]
    if missing:
        raise ReportError(f"{name}: {path} lacks {', '.join(missing)}")
    return dict(doc)


def rendered(root: Path, path: Path) -> tuple[str, list[str]]:
    """``path``'s text with every report block rendered, and the names of the blocks that changed."""
    text = path.read_text()
    changed: list[str] = []

    def one(m: re.Match[str]) -> str:
        name = m["name"]
        link = os.path.relpath(root / RESULTS_DIR / f"{name}.json", path.parent)
        body = render(name, load_result(root, name), link)
        if body != m["body"]:
            changed.append(name)
        return f"<!-- report:{name} -->\n{body}<!-- /report:{name} -->"

    return _BLOCK.sub(one, text), changed


def write_all(root: Path, check: bool) -> list[str]:
    """Render every block under ``root`` (or, ``check``, only compare); ``file: name`` of each that differed."""
    stale: list[str] = []
    for path in markdown_files(root):
        new, changed = rendered(root, path)
        stale += [f"{path.relative_to(root)}: {name}" for name in changed]
        if changed and not check:
            path.write_text(new)
    return stale


def unused(root: Path) -> list[str]:
    """Result files no markdown block shows."""
    shown = {b.name for path in markdown_files(root) for b in blocks(path)}
    return sorted(p.stem for p in (root / RESULTS_DIR).glob("*.json") if p.stem not in shown)


# ---------------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """``kvpool report`` flags."""
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: the current directory)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming every table that differs from its results file")
    p.add_argument("--add", type=Path, metavar="RUN_DIR",
                   help="a results directory of kvpool demo or bench_vs_mooncake.py to keep as results/NAME.json")
    p.add_argument("--as", dest="name", metavar="NAME", help="the result's name (with --add)")
    p.add_argument("--command", help="with --add: the command that made the run (default: what the run recorded)")
    p.add_argument("--machine", help="with --add: the machine in a few words (e.g. '2-core VM, a build beside it')")


def run(args: argparse.Namespace) -> int:
    """Add a run when asked, then render (or check) every report block."""
    root: Path = args.root
    try:
        if args.add is not None:
            if not args.name or not re.fullmatch(r"[\w.-]+", args.name):
                print("kvpool report: --add needs --as NAME (letters, digits, '.', '-', '_')", file=sys.stderr)
                return 2
            doc = from_run_dir(args.add, args.command, args.machine)
            dest = root / RESULTS_DIR / f"{args.name}.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"kvpool report: wrote {dest}; show it with <!-- report:{args.name} --> "
                  f"<!-- /report:{args.name} --> in a doc", file=sys.stderr)
        stale = write_all(root, check=args.check)
    except ReportError as exc:
        print(f"kvpool report: {exc}", file=sys.stderr)
        return 1
    for name in unused(root):
        print(f"kvpool report: note: results/{name}.json is shown by no doc", file=sys.stderr)
    if args.check:
        for line in stale:
            print(f"kvpool report: stale table: {line} (run kvpool report)", file=sys.stderr)
        return 1 if stale else 0
    for line in stale:
        print(f"kvpool report: rendered {line}", file=sys.stderr)
    return 0
