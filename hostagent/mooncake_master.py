"""Start and stop the processes of a small Mooncake Store deployment: master and store nodes.

Mooncake Store (``mooncake-transfer-engine-non-cuda`` on PyPI) has three roles:

- ``mooncake_master``: object metadata, allocation, leases and eviction. Here it also runs
  the HTTP metadata server that the transfer engines use to find each other
  (``--enable_http_metadata_server``), so no etcd is needed.
- store nodes: processes that contribute DRAM ("global segments") to the pool. The
  ``mooncake_client`` binary is a standalone one; a Python client that mounts a segment is
  another.
- clients: read and write objects (``hostagent.mooncake_backend.MooncakeBackend``).

``MooncakeMaster`` and ``MooncakeStoreNode`` start one process each on free ports, wait
until it serves, log to a file and stop exactly the process they started, by PID. Both are
context managers. A store node joins a master started elsewhere through ``MasterAddress``
(the command line's ``--join``: store nodes on several hosts, one pool). Everything binds
the given address (loopback by default, a Mininet host's address in experiments), except
that the master's HTTP metadata server listens on all addresses whatever
``--http_metadata_server_host`` says (observed with 0.3.13.post1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, Self

MASTER_BINARY = "mooncake_master"
STORE_NODE_BINARY = "mooncake_client"
# Smallest DRAM segment a store node or client may mount ("Total size must be at least").
MIN_SEGMENT_BYTES = 16 << 20
_INSTALL_HINT = "install mooncake-transfer-engine-non-cuda (bash scripts/setup.sh)"


class MooncakeProcessError(RuntimeError):
    """A Mooncake binary is missing, failed to start, or did not become ready in time."""


def find_binary(name: str) -> Path:
    """Path of a binary shipped inside the installed ``mooncake`` package (or on PATH)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / name
            if candidate.is_file():
                if not os.access(candidate, os.X_OK):
                    raise MooncakeProcessError(f"{candidate} is not executable; reinstall: {_INSTALL_HINT}")
                return candidate
    # The venv's console script of the same name execs the binary, keeping the PID.
    on_path = shutil.which(name)
    if on_path is not None:
        return Path(on_path)
    raise MooncakeProcessError(f"{name} not found: {_INSTALL_HINT}")


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the caller must still handle a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _connect_host(host: str) -> str:
    """Address to connect to for a server bound to ``host`` (a wildcard means loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((_connect_host(host), port), timeout=0.5):
            return True
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log file, joined on one line for an error message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


class _ManagedProcess:
    """One child process with a log file, stopped by its PID only."""

    def __init__(self, name: str, log_path: Path | None) -> None:
        self._name = name
        if log_path is None:
            log_dir = Path(tempfile.mkdtemp(prefix=f"kvpool-{name}-"))
            log_path = log_dir / f"{name}.log"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """PID of the running process, or None when not started."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``argv`` with output appended to the log file."""
        if self._proc is not None:
            raise MooncakeProcessError(f"{self._name} already started (pid {self._proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(("$ " + " ".join(argv) + "\n").encode())
        self._log.flush()
        try:
            # A session of its own: a Ctrl-C meant for the test runner does not reach it.
            self._proc = subprocess.Popen(
                argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise MooncakeProcessError(f"cannot run {argv[0]}: {exc}") from exc

    def _check_alive(self) -> None:
        """Raise with the log's tail when the process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            raise MooncakeProcessError(
                f"{self._name} exited with code {code} during start-up; log {self.log_path}: {_log_tail(self.log_path)}"
            )

    def kill(self) -> None:
        """SIGKILL the process (to test crash handling); the log is kept."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.send_signal(signal.SIGKILL)
                self._proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        """Close our handle on the log file."""
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass(frozen=True)
class MasterConfig:
    """Flags of ``mooncake_master`` that kvpool cares about; ports 0 mean "pick a free one"."""

    host: str = "127.0.0.1"
    rpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    # After a read an object is leased for this long and cannot be evicted or removed
    # (except by a forced remove). Mooncake's default is 10 s.
    lease_ttl_ms: int = 10_000
    # Eviction starts when pool usage passes this ratio and frees eviction_ratio of it.
    eviction_high_watermark: float = 0.9
    eviction_ratio: float = 0.05
    # A client or store node that misses heartbeats this long is dropped with its segments.
    client_ttl_s: int = 10
    rpc_threads: int = 2
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        """Reject values the master would refuse or misread."""
        if not 0 < self.eviction_high_watermark <= 1 or not 0 < self.eviction_ratio <= 1:
            raise ValueError("eviction_high_watermark and eviction_ratio must lie in (0, 1]")
        if self.lease_ttl_ms < 0 or self.client_ttl_s <= 0 or self.rpc_threads <= 0:
            raise ValueError("lease_ttl_ms must be >= 0, client_ttl_s and rpc_threads > 0")


class MooncakeMaster(_ManagedProcess):
    """A ``mooncake_master`` with its HTTP metadata server, on free ports of one address."""

    def __init__(self, config: MasterConfig | None = None, log_path: Path | None = None) -> None:
        super().__init__(MASTER_BINARY, log_path)
        self.config = config or MasterConfig()
        self.rpc_port = 0
        self.http_port = 0
        self.metrics_port = 0

    @property
    def rpc_address(self) -> str:
        """``host:port`` of the master's RPC service, for clients' ``master_server_address``."""
        return f"{_connect_host(self.config.host)}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        """URL of the HTTP metadata server, for clients' ``metadata_server``."""
        return f"http://{_connect_host(self.config.host)}:{self.http_port}/metadata"

    @property
    def admin_url(self) -> str:
        """Base URL of the master's admin/metrics HTTP server."""
        return f"http://{_connect_host(self.config.host)}:{self.metrics_port}"

    def argv(self, binary: Path) -> list[str]:
        """Command line for the chosen ports."""
        c = self.config
        return [
            str(binary),
            f"--rpc_address={c.host}",
            f"--rpc_port={self.rpc_port}",
            f"--rpc_thread_num={c.rpc_threads}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={c.host}",
            f"--http_metadata_server_port={self.http_port}",
            f"--metrics_host={c.host}",
            f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={c.lease_ttl_ms}",
            f"--eviction_high_watermark_ratio={c.eviction_high_watermark}",
            f"--eviction_ratio={c.eviction_ratio}",
            f"--client_ttl={c.client_ttl_s}",
            *c.extra_args,
        ]

    def start(self, timeout: float = 20.0, attempts: int = 3) -> Self:
        """Start the master and wait until RPC, metadata and admin servers all answer."""
        binary = find_binary(MASTER_BINARY)
        c = self.config
        for attempt in range(1, attempts + 1):
            # Free ports can be taken between the probe and the bind: retry with new ones.
            self.rpc_port = c.rpc_port or free_tcp_port(_connect_host(c.host))
            self.http_port = c.http_port or free_tcp_port(_connect_host(c.host))
            self.metrics_port = c.metrics_port or free_tcp_port(_connect_host(c.host))
            self._spawn(self.argv(binary))
            try:
                self._wait_ready(timeout)
                return self
            except MooncakeProcessError:
                self.stop()
                self._proc = None
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout: float) -> None:
        """Poll until the admin /health says service_ready and both other ports accept."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if (
                self._healthy()
                and _port_open(c_host := self.config.host, self.rpc_port)
                and _port_open(c_host, self.http_port)
            ):
                return
            time.sleep(0.05)
        raise MooncakeProcessError(
            f"{MASTER_BINARY} not ready after {timeout:.0f} s; log {self.log_path}: {_log_tail(self.log_path)}"
        )

    def _healthy(self) -> bool:
        """Whether the admin server reports the service ready."""
        try:
            body = self.admin_get("/health", timeout=0.5)
        except MooncakeProcessError:
            return False
        with contextlib.suppress(ValueError):
            return bool(json.loads(body).get("service_ready"))
        return False

    def admin_get(self, path: str, timeout: float = 2.0) -> str:
        """GET a path of the master's admin server (``/metrics/summary``, ``/get_all_segments``...)."""
        return _admin_get(self.admin_url, path, timeout)

    def segments(self) -> list[str]:
        """Names of the memory segments currently mounted in the pool."""
        return _segments(self.admin_url)

    def __enter__(self) -> Self:
        """Start unless already running."""
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the master."""
        self.stop()


def _admin_get(admin_url: str, path: str, timeout: float = 2.0) -> str:
    try:
        with urllib.request.urlopen(admin_url + path, timeout=timeout) as resp:
            return bytes(resp.read()).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise MooncakeProcessError(f"master admin {path}: {exc}") from exc


def _segments(admin_url: str) -> list[str]:
    body = _admin_get(admin_url, "/get_all_segments").strip()
    return [line.strip() for line in body.splitlines() if line.strip()]


class PoolMaster(Protocol):
    """What a store node needs of its master: where to register, and the segments mounted so far."""

    @property
    def rpc_address(self) -> str:
        """``host:port`` of the master's RPC service."""
        ...

    @property
    def metadata_url(self) -> str:
        """URL of the HTTP metadata server."""
        ...

    def segments(self) -> list[str]:
        """Names of the memory segments currently mounted in the pool."""
        ...


@dataclass(frozen=True)
class MasterAddress:
    """A master started elsewhere (another host, another process), by its three addresses."""

    rpc_address: str
    metadata_url: str
    admin_url: str

    @classmethod
    def from_ready(cls, path: Path) -> MasterAddress:
        """Read the ready JSON a ``mooncake`` command wrote (``--ready-file``); one-line errors."""
        try:
            info = json.loads(path.read_text())
            return cls(str(info["rpc_address"]), str(info["metadata_url"]), str(info["admin_url"]))
        except FileNotFoundError:
            raise MooncakeProcessError(f"{path}: no such ready file (is the master's pool running?)") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise MooncakeProcessError(f"{path}: not a mooncake ready file ({exc})") from None

    def segments(self) -> list[str]:
        """Names of the memory segments currently mounted in the pool."""
        return _segments(self.admin_url)


class MooncakeStoreNode(_ManagedProcess):
    """A ``mooncake_client`` process that contributes ``segment_bytes`` of DRAM to the pool."""

    def __init__(
        self, master: PoolMaster, segment_bytes: int, host: str = "127.0.0.1", log_path: Path | None = None
    ) -> None:
        super().__init__(STORE_NODE_BINARY, log_path)
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES} (16 MiB), got {segment_bytes}")
        self.master = master
        self.segment_bytes = segment_bytes
        self.host = host
        self.port = 0
        self.segment_name = ""

    def start(self, timeout: float = 20.0) -> Self:
        """Start the node and wait until the master lists its segment."""
        binary = find_binary(STORE_NODE_BINARY)
        self.port = free_tcp_port(_connect_host(self.host))
        before = set(self.master.segments())
        argv = [
            str(binary),
            f"--host={self.host}",
            f"--port={self.port}",
            f"--global_segment_size={self.segment_bytes}",
            "--local_buffer_size=0",
            "--protocol=tcp",
            f"--master_server_address={self.master.rpc_address}",
            f"--metadata_server={self.master.metadata_url}",
        ]
        # Without it the transfer engine advertises the first non-loopback interface.
        env = dict(os.environ, MC_TCP_BIND_ADDRESS=_connect_host(self.host))
        self._spawn(argv, env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if new := set(self.master.segments()) - before:
                # Named by its transfer engine's host:port, not by --port.
                self.segment_name = min(new)
                return self
            time.sleep(0.05)
        self.stop()
        raise MooncakeProcessError(
            f"{STORE_NODE_BINARY} segment not mounted after {timeout:.0f} s; log {self.log_path}: "
            f"{_log_tail(self.log_path)}"
        )

    def __enter__(self) -> Self:
        """Start unless already running."""
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the node (its objects leave the pool with it)."""
        self.stop()


# -- command line: ``python -m hostagent.mooncake_master`` (``kvpool mooncake``) ---------
def _mib(text: str) -> int:
    """Parse a positive size in MiB for argparse."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``mooncake`` command: run a master and store nodes until stopped."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    parser.add_argument("--store-nodes", type=int, default=1, help="mooncake_client store nodes to start (default 1)")
    parser.add_argument("--segment-mib", type=_mib, default=256, help="DRAM per store node, MiB (default 256)")
    parser.add_argument("--lease-ms", type=int, default=10_000, help="read lease blocking eviction (default 10000)")
    parser.add_argument("--high-watermark", type=float, default=0.9, help="eviction trigger ratio (default 0.9)")
    parser.add_argument("--eviction-ratio", type=float, default=0.05, help="share freed per eviction (default 0.05)")
    parser.add_argument("--log-dir", type=Path, default=None, help="where the logs go (default: a temp dir)")
    parser.add_argument("--ready-file", type=Path, default=None, help="also write the ready JSON line here")
    parser.add_argument("--join", type=Path, default=None, metavar="READY_FILE",
                        help="start only store nodes, joining the running pool whose ready JSON is in this file")


def run(args: argparse.Namespace) -> int:
    """Start the pool (or, with ``--join``, store nodes for a running one), print one JSON line, serve until stopped."""
    if args.store_nodes < 0:
        print("mooncake: --store-nodes must be >= 0", file=sys.stderr)
        return 2
    if args.segment_mib << 20 < MIN_SEGMENT_BYTES:
        print(f"mooncake: --segment-mib must be at least {MIN_SEGMENT_BYTES >> 20}", file=sys.stderr)
        return 2
    try:
        config = MasterConfig(
            host=args.host,
            lease_ttl_ms=args.lease_ms,
            eviction_high_watermark=args.high_watermark,
            eviction_ratio=args.eviction_ratio,
        )
    except ValueError as exc:
        print(f"mooncake: {exc}", file=sys.stderr)
        return 2
    log_dir: Path | None = args.log_dir
    master: MooncakeMaster | None = None
    nodes: list[MooncakeStoreNode] = []
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        pool: PoolMaster
        if args.join is not None:
            joined = MasterAddress.from_ready(args.join)
            pool, admin_url = joined, joined.admin_url
        else:
            master = MooncakeMaster(config, log_path=None if log_dir is None else log_dir / "mooncake_master.log")
            pool, admin_url = master.start(), master.admin_url
        prefix = f"mooncake_store_{args.host}_" if args.join is not None else "mooncake_store"
        for i in range(args.store_nodes):
            log = None if log_dir is None else log_dir / f"{prefix}{i}.log"
            nodes.append(MooncakeStoreNode(pool, args.segment_mib << 20, host=args.host, log_path=log).start())
        info: dict[str, object] = {
            "rpc_address": pool.rpc_address,
            "metadata_url": pool.metadata_url,
            "admin_url": admin_url,
            "master_pid": master.pid if master is not None else None,
            "store_nodes": [{"segment": n.segment_name, "pid": n.pid, "bytes": n.segment_bytes} for n in nodes],
            "log": str(master.log_path) if master is not None else None,
        }
        ready = json.dumps(info)
        if args.ready_file is not None:
            # Written whole before the line is printed: a reader of either never sees half.
            partial = args.ready_file.with_name(args.ready_file.name + ".tmp")
            partial.write_text(ready + "\n")
            partial.replace(args.ready_file)
        print(ready, flush=True)
        while not stop.wait(0.5):
            if master is not None and not master.running:
                print(f"mooncake: master exited; log {master.log_path}", file=sys.stderr)
                return 1
            if any(not n.running for n in nodes):
                print("mooncake: a store node exited; see its log", file=sys.stderr)
                return 1
        return 0
    except MooncakeProcessError as exc:
        print(f"mooncake: {exc}", file=sys.stderr)
        return 1
    finally:
        for node in nodes:
            node.stop()
        if master is not None:
            master.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hostagent.mooncake_master``."""
    parser = argparse.ArgumentParser(prog="python -m hostagent.mooncake_master", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
