"""kvpool-ctl: operate the pool from a terminal, through the controller daemon's API.

Start the daemon with its API (``kvpool-controller ... --api 127.0.0.1:7480``), then::

    kvpool-ctl status                 switches, controller epoch, nodes up/down
    kvpool-ctl top --sort hits        hottest chunks (--watch refreshes in place)
    kvpool-ctl admit 0x1f2e...        operator overrides, applied within one epoch
    kvpool-ctl evict 0x1f2e... --drop
    kvpool-ctl pin KEY / unpin KEY
    kvpool-ctl quota TENANT SLOTS     (SLOTS "off" lifts the quota)
    kvpool-ctl tiers                  capacity and use of every tier across nodes
    kvpool-ctl stats                  data-plane counters per switch
    kvpool-ctl nodes / chunk KEY      the directory: nodes, and who holds a chunk
    kvpool-ctl shell s1               p4runtime-shell attached to switch s1

Tables by default, ``--json`` prints the API's JSON object instead. The daemon's address
comes from ``--api`` or ``$KVPOOL_CTL_API`` (``http://HOST:PORT`` or ``unix:/PATH``).
Overrides carry the operator's token, read from ``--token-file`` (default: the file the
daemons made, ``kvpool.auth``); without it the daemon refuses them (exit 1).

Exit status: 0 done; 1 the daemon refused (no space, pinned limit, unknown key, ...);
2 bad arguments; 3 the daemon is unreachable; 4 a switch is unreachable (or, for
``status``, not connected).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvpool import auth
from kvpool.http_api import ApiError, ApiUnreachableError
from kvpool.http_client import JsonClient

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_DAEMON_UNREACHABLE = 3
EXIT_SWITCH_UNREACHABLE = 4

DEFAULT_API = "http://127.0.0.1:7480"
SORT_KEYS = ("value", "hits", "fetches", "estimate")
#: Election id of the shell: below the controller's (0, 1), so the shell is a read-only backup
#: and never takes the switch from the controller.
SHELL_ELECTION_ID = "0,0"


class CtlError(Exception):
    """A failure to report as one line on stderr with exit status ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _key(text: str) -> str:
    """A chunk key argument: hex with or without 0x, up to 64 bits; normalized to 0x-hex."""
    try:
        key = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a hex chunk key") from None
    if not 0 <= key < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text!r} does not fit 64 bits")
    return f"{key:#x}"


def _slots(text: str) -> int | None:
    if text.lower() in ("off", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"SLOTS {text!r}: expected a number of slots >= 1, or off") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"SLOTS {text!r}: expected a number of slots >= 1, or off")
    return value


def _nonneg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return value


def _positive(text: str) -> int:
    value = _nonneg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def _common(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the command (``kvpool-ctl --json status`` = ``status --json``)."""
    p = argparse.ArgumentParser(add_help=False)
    _add_common(p, suppress)
    return p


def _add_common(p: argparse.ArgumentParser, suppress: bool) -> None:
    # After the command their defaults are suppressed, so they do not undo a value given before it.
    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--api", default=d(os.environ.get("KVPOOL_CTL_API", DEFAULT_API)),
                   help=f"controller API: http://HOST:PORT or unix:/PATH (default $KVPOOL_CTL_API or {DEFAULT_API})")
    p.add_argument("--json", action="store_true", default=d(False), help="print JSON instead of tables")
    p.add_argument("--timeout", type=float, default=d(10.0), help="seconds to wait for the daemon (default 10)")
    p.add_argument("--token-file", type=Path, default=d(None), metavar="PATH",
                   help="token for overrides (default $KVPOOL_TOKEN_FILE, else the daemons' default: "
                        "$XDG_RUNTIME_DIR/kvpool/token or ~/.config/kvpool/token)")


def build_parser() -> argparse.ArgumentParser:
    """The ``kvpool-ctl`` argument parser."""
    p = argparse.ArgumentParser(prog="kvpool-ctl", description=(__doc__ or "").splitlines()[0],
                                epilog="exit status: 0 ok, 1 refused by the daemon, 2 bad arguments, "
                                       "3 daemon unreachable, 4 switch unreachable")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options and commands of kvpool-ctl on ``p`` (also ``kvpool ctl`` through the umbrella command)."""
    _add_common(p, False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = [_common(True)]
    sub.add_parser("status", parents=c, help="switches (target, connection, pipeline, pool slots), epoch, nodes")
    top = sub.add_parser("top", parents=c, help="hottest chunks: reuse value, hits, sketch estimate, tier, holder")
    top.add_argument("--sort", choices=SORT_KEYS, default="value", help="order (default value)")
    top.add_argument("--limit", type=_positive, default=20, help="rows (default 20)")
    top.add_argument("--watch", action="store_true", help="refresh in place until interrupted")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes with --watch")
    top.add_argument("--count", type=_positive, default=None, help="with --watch: stop after N refreshes")
    for name, what in (("admit", "place a chunk in the switch pool now (it then competes on value)"),
                       ("pin", "keep a chunk in the switch pool until unpinned"),
                       ("unpin", "let a pinned chunk compete on value again")):
        sp = sub.add_parser(name, parents=c, help=what)
        sp.add_argument("key", type=_key, metavar="KEY", help="chunk key (hex)")
        if name == "pin":
            sp.add_argument("--tenant", type=_nonneg, default=0, help="tenant charged for the pin (default 0)")
    ev = sub.add_parser("evict", parents=c, help="take a chunk out of the switch pool now")
    ev.add_argument("key", type=_key, metavar="KEY", help="chunk key (hex)")
    how = ev.add_mutually_exclusive_group()
    how.add_argument("--demote", dest="action", action="store_const", const="demote",
                     help="keep it in a lower tier (refused when no live node holds it there; the default)")
    how.add_argument("--drop", dest="action", action="store_const", const="drop", help="just drop the switch copy")
    ev.set_defaults(action="demote")
    q = sub.add_parser("quota", parents=c, help="limit a tenant's switch slots (evicts its lowest-value chunks)")
    q.add_argument("tenant", type=_nonneg, metavar="TENANT", help="tenant id")
    q.add_argument("slots", type=_slots, metavar="SLOTS", help="slots, or off to lift the quota")
    sub.add_parser("tiers", parents=c, help="capacity and use of each tier across nodes")
    st = sub.add_parser("stats", parents=c, help="data-plane counters per switch")
    st.add_argument("--all", action="store_true", help="show zero counters too")
    sub.add_parser("nodes", parents=c, help="registered agents, up and down")
    ch = sub.add_parser("chunk", parents=c, help="where a chunk lives: holders, tiers, switch slot")
    ch.add_argument("key", type=_key, metavar="KEY", help="chunk key (hex)")
    sh = sub.add_parser("shell", parents=c, help="p4runtime-shell attached to a switch (read-only by default)")
    sh.add_argument("switch", metavar="SWITCH", help="switch name (as in kvpool-ctl status)")
    sh.add_argument("--election-id", default=SHELL_ELECTION_ID, metavar="HI,LO",
                    help=f"election id (default {SHELL_ELECTION_ID}: a read-only backup; a higher one than the "
                         "controller's 0,1 takes the switch from it until the shell exits)")


# ---------------------------------------------------------------------------------- rendering
def _console() -> Any:
    from rich.console import Console

    # Piped output (scripts, tests) would be cut at rich's default of 80 columns.
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def _table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], right: int = 0) -> Any:
    """A rich table; the last ``right`` columns are numbers (right-aligned)."""
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, justify="right" if i >= len(columns) - right else "left")
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t


def _bytes(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def render_status(doc: dict[str, Any]) -> Any:
    """Status as a header line and a switch table."""
    from rich.console import Group
    from rich.text import Text

    nodes = doc.get("nodes", {})
    pool = doc.get("pool", {})
    failed = doc.get("failed_epochs") or 0
    head = Text(f"controller: epoch {doc.get('epoch')}, mode {doc.get('mode')}, target {doc.get('target')}, "
                f"{doc.get('catalog', 0)} chunks in the catalog, pool {pool.get('chunks', 0)} chunks; "
                f"nodes {nodes.get('up', 0)} up, {nodes.get('down', 0)} down"
                + (f"; {failed} failed epoch(s), last: {doc.get('last_epoch_error')}" if failed else ""))
    rows = []
    now = time.time()
    for name, sw in sorted(doc.get("switches", {}).items()):
        state = sw.get("state") or (("master" if sw["master"] else "backup") if sw["connected"] else "down")
        conn = {"up": "master"}.get(state, state.upper() if state == "down" else state)
        if sw.get("down_since") and state != "up":
            conn += f" for {now - float(sw['down_since']):.0f} s"
        pipe = sw["pipeline"]
        error = (sw.get("last_error") or "-") if state != "up" else "-"
        rows.append([name, sw["address"], sw["device_id"], conn, error,
                     f"{pipe['p4info']} ({'installed' if pipe.get('installed') else 'NOT installed'})",
                     sw["slots"]["used"], sw["slots"]["free"]])
    return Group(head, _table(None, ["switch", "address", "device", "connection", "last error", "pipeline",
                                     "slots used", "slots free"], rows, right=2))


def render_top(doc: dict[str, Any]) -> Any:
    """The hottest-chunks table."""
    rows = [[r["key"], f"{r['value']:.3g}", r["hits"], r["fetches"], r["estimate"], r["reported"], r["tier"],
             ",".join(r["holders"]) or "-", "pinned" if r["pinned"] else "",
             "-" if r["base_slot"] is None else r["base_slot"]] for r in doc.get("chunks", [])]
    return _table(f"top chunks by {doc.get('sort')} (epoch {doc.get('epoch')})",
                  ["key", "value", "hits", "fetches", "estimate", "reported", "tier", "holders", "pin", "slot"],
                  rows)


def render_tiers(doc: dict[str, Any]) -> Any:
    """Capacity and use per tier."""
    rows = []
    for tier, t in doc.get("tiers", {}).items():
        pct = f"{100 * t['used'] / t['capacity']:.1f}%" if t["capacity"] else "-"
        rows.append([tier, _bytes(t["capacity"]), _bytes(t["used"]), pct, t["chunks"], t["nodes"]])
    return _table("tiers (live nodes; switch = all switches)", ["tier", "capacity", "used", "use", "chunks",
                                                                 "nodes"], rows, right=5)


#: Counters always shown by ``stats`` even when zero (what an operator looks for first).
_HEADLINE = ("pool.hit", "pool.fill", "coalesce.absorbed", "coalesce.release", "popularity.reported",
             "slots.hits", "slots.fills")


def render_stats(doc: dict[str, Any], show_all: bool) -> Any:
    """Counters: one row per counter, one column per switch."""
    switches = sorted(doc.get("switches", {}))
    values: dict[str, dict[str, int]] = {}
    errors = []
    for name in switches:
        sw = doc["switches"][name]
        if "error" in sw:
            errors.append(f"{name}: {sw['error']}")
            continue
        for section, cells in sw.items():
            if isinstance(cells, dict):
                for label, v in cells.items():
                    values.setdefault(f"{section}.{label}", {})[name] = int(v)
    rows = [[k, *(values[k].get(s, "-") for s in switches)] for k in values
            if show_all or k in _HEADLINE or any(values[k].values())]
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [_table("data-plane counters (packets)", ["counter", *switches], rows, right=len(switches))]
    parts += [Text(f"unreachable: {e}", style="red") for e in errors]
    return Group(*parts)


def render_nodes(doc: dict[str, Any]) -> Any:
    """Registered nodes."""
    rows = [[n["node_id"], n["address"], n["role"], "up" if n["up"] else "DOWN",
             ", ".join(f"{t} {_bytes(n['used'].get(t, 0))}/{_bytes(c)}" for t, c in n["capacities"].items()) or "-",
             n["chunks"], f"{n['last_seen_s']:.1f}s"] for n in doc.get("nodes", [])]
    return _table("nodes", ["node", "address", "role", "state", "tiers (used/capacity)", "chunks", "last seen"],
                  rows, right=2)


def render_chunk(doc: dict[str, Any]) -> Any:
    """One chunk's holders and switch placement."""
    rows = [[h["node_id"], h["address"], h["tier"], h["nbytes"]] for h in doc.get("holders", [])]
    sw = doc.get("switch")
    if sw is not None and sw["tier"] == "switch":
        rows.insert(0, ["(switches)", "-", "switch", f"slots {sw['base_slot']}..{sw['base_slot'] + sw['slots'] - 1}"])
    return _table(f"chunk {doc.get('key')}", ["holder", "address", "tier", "bytes"], rows, right=1)


def render_override(doc: dict[str, Any]) -> Any:
    """One line: what an override did."""
    from rich.text import Text

    what = doc.get("op", "?")
    parts = [f"{what} {doc.get('key', '')}".strip()]
    if doc.get("already"):
        parts.append("(already so)")
    if what == "quota":
        parts = [f"quota of tenant {doc['tenant']}: {doc['slots'] if doc['slots'] is not None else 'off'}"]
    if doc.get("base_slot") is not None and what in ("admit", "pin"):
        parts.append(f"at slot {doc['base_slot']}")
    if doc.get("action"):
        parts.append(f"({doc['action']})")
    if doc.get("admitted"):
        parts.append(f"admitted {', '.join(doc['admitted'])}")
    if doc.get("evicted"):
        parts.append(f"evicted {', '.join(doc['evicted'])}")
    parts.append(f"in epoch {doc.get('epoch')}")
    return Text(" ".join(parts))


# ---------------------------------------------------------------------------------- commands
def _top_path(args: argparse.Namespace) -> str:
    return f"/v1/top?sort={args.sort}&limit={args.limit}"


def _watch(client: JsonClient, args: argparse.Namespace) -> int:
    from rich.live import Live

    console = _console()
    shown = 0
    with Live(render_top(client.get(_top_path(args))), console=console, auto_refresh=False) as live:
        shown = 1
        try:
            while args.count is None or shown < args.count:
                time.sleep(args.interval)
                live.update(render_top(client.get(_top_path(args))), refresh=True)
                shown += 1
        except KeyboardInterrupt:
            pass
    return EXIT_OK


def _shell(client: JsonClient, args: argparse.Namespace) -> int:
    sw = client.get(f"/v1/switches/{args.switch}")
    import grpc

    channel = grpc.insecure_channel(sw["address"])
    try:
        grpc.channel_ready_future(channel).result(timeout=min(args.timeout, 5.0))
    except grpc.FutureTimeoutError:
        raise CtlError(EXIT_SWITCH_UNREACHABLE, f"switch {args.switch} at {sw['address']} does not answer "
                                                "P4Runtime") from None
    finally:
        channel.close()
    # No --config: the shell reads the P4Info the switch runs, and pushes nothing.
    cmd = [sys.executable, "-m", "p4runtime_sh", "--grpc-addr", sw["address"], "--device-id",
           str(sw["device_id"]), "--election-id", args.election_id]
    return subprocess.call(cmd)


def _execute(args: argparse.Namespace) -> int:
    """Execute one parsed command; returns the exit status (raises CtlError / client errors)."""
    client = JsonClient(args.api, args.timeout, "controller API", auth.secret(args.token_file))
    cmd = args.command
    out: Callable[[dict[str, Any]], Any]
    status = EXIT_OK
    if cmd == "status":
        doc = client.get("/v1/status")
        out = render_status
        if any(not sw["connected"] for sw in doc["switches"].values()):
            status = EXIT_SWITCH_UNREACHABLE
    elif cmd == "top":
        if args.watch and not args.json:
            return _watch(client, args)
        doc, out = client.get(_top_path(args)), render_top
    elif cmd in ("admit", "pin", "unpin", "evict"):
        body: dict[str, Any] = {"key": args.key}
        if cmd == "evict":
            body["action"] = args.action
        if cmd == "pin":
            body["tenant"] = args.tenant
        doc, out = client.post(f"/v1/{cmd}", body), render_override
    elif cmd == "quota":
        doc, out = client.post("/v1/quota", {"tenant": args.tenant, "slots": args.slots}), render_override
    elif cmd == "tiers":
        doc, out = client.get("/v1/tiers"), render_tiers
    elif cmd == "stats":
        doc = client.get("/v1/stats")

        def out(d: dict[str, Any]) -> Any:
            return render_stats(d, args.all)

        if any("error" in sw for sw in doc["switches"].values()):
            status = EXIT_SWITCH_UNREACHABLE
    elif cmd == "nodes":
        doc, out = client.get("/v1/nodes"), render_nodes
    elif cmd == "chunk":
        doc, out = client.get(f"/v1/chunks/{args.key}"), render_chunk
    elif cmd == "shell":
        return _shell(client, args)
    else:  # argparse only accepts the commands above
        raise CtlError(EXIT_USAGE, f"unknown command {cmd!r}")
    if args.json:
        print(json.dumps(doc))
    else:
        _console().print(out(doc))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kvpool-ctl``."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Execute parsed arguments; errors become one line on stderr and the documented exit status."""
    try:
        return _execute(args)
    except ValueError as exc:  # a malformed --api address, an unusable token file
        print(f"kvpool-ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiUnreachableError as exc:
        print(f"kvpool-ctl: {exc} (is kvpool-controller running with --api?)", file=sys.stderr)
        return EXIT_DAEMON_UNREACHABLE
    except ApiError as exc:
        print(f"kvpool-ctl: {args.command}: {exc} [{exc.code}]", file=sys.stderr)
        if exc.code == "switch_unreachable":
            return EXIT_SWITCH_UNREACHABLE
        return EXIT_USAGE if exc.status == 400 else EXIT_REFUSED
    except CtlError as exc:
        print(f"kvpool-ctl: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
