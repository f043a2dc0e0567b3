"""One switch's P4Runtime session: channel, stream, arbitration, reconnects and instance checks.

:class:`SwitchSession` opens the channel and the stream, wins (or loses) arbitration,
receives digests and packet-ins, and runs the watcher thread that reconnects with backoff
for ever and resyncs after a reconnect, a promotion or a foreign pipeline push. Every
read goes through :meth:`SwitchSession._call`, which discards an answer that arrived on
another session than the call started on: gRPC reconnects a channel by itself, so a read
could otherwise reach a restarted switch and take its empty state for ours.

Switch instances: the pipeline cookie is the pipeline's 40-bit hash plus a nonce drawn at
each push. On every (re)connect the driver reads the switch's cookie: none (a restarted
switch), another pipeline's, or ours with another nonce (someone else pushed it) means a
new instance, counted in ``instance`` so that the owner can reset what it keeps about the
switch's registers and counters. The writes, reads and resync live in the subclasses
(:mod:`.writes`, :mod:`.reads`, :mod:`.switch`); :meth:`resync` is theirs.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4runtime.entities import Digest, PacketIn, _Intended
from controller.p4runtime.errors import (
    NoPipelineError,
    NotMasterError,
    P4RuntimeCallError,
    P4RuntimeError,
    SwitchUnreachableError,
)
from kvpool.p4rt import codec
from kvpool.p4rt.codec import CodecError
from kvpool.p4rt.p4info import P4Info, P4InfoError, TableInfo

#: One logger for the whole driver, whichever of its modules speaks.
log = logging.getLogger("controller.p4runtime")


#: Low bits of a pipeline cookie: a nonce drawn at each push (the high 40 bits name the pipeline).
NONCE_BITS = 23


def pipeline_id(p4info: bytes, device_config: bytes) -> int:
    """40-bit hash naming a pipeline (P4Info + device config): the high bits of every cookie we push."""
    return int.from_bytes(hashlib.blake2b(p4info + b"\0" + device_config, digest_size=5).digest(), "big")


def make_cookie(pipeline: int, nonce: int | None = None) -> int:
    """A pipeline cookie: ``pipeline`` (40 bits) and a push nonce (random when None); below 2**63."""
    if nonce is None:
        nonce = secrets.randbits(NONCE_BITS)
    return (pipeline << NONCE_BITS) | (nonce & ((1 << NONCE_BITS) - 1))


def channel_options(max_backoff_s: float) -> list[tuple[str, int]]:
    """gRPC channel arguments for a switch connection: big messages, and reconnects at the driver's pace.

    gRPC's own defaults retry a refused connect after 1 s, then 1.6x longer each time (up to
    120 s), and share one subchannel (and its backoff) among a process's channels to the same
    address. A switch down for 6 s was then found 3-4 s after it listened again, one down for
    9 s only after ``channel_ready_future`` gave up (10 s) and a fresh channel tried. Here a
    channel of its own retries after 0.1 s, backs off to at most ``max_backoff_s`` and gives
    up a hung connect attempt after 1 s, so the driver sees a restarted switch within about
    ``max_backoff_s`` of its listening however long it was away.
    """
    max_ms = max(100, int(max_backoff_s * 1000))
    return [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20),
            ("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 1000), ("grpc.max_reconnect_backoff_ms", max_ms)]

class SwitchSession:
    """The connection half of :class:`~controller.p4runtime.P4RuntimeSwitch` (see the module docstring).

    ``wait_ready_s`` bounds how long a call waits for a reconnect in progress (default
    ``timeout_s``; 0 fails at once). With ``defer_writes`` a write made while the switch is
    down, or one the connection drops, only changes the intended state, which the resync
    after the reconnect applies: the owner keeps going through a switch's restart.
    """

    def __init__(
        self,
        address: str,
        p4info: str | Path | P4Info,
        device_config: str | Path | bytes | None = None,
        device_id: int = 1,
        election_id: tuple[int, int] = (0, 1),
        timeout_s: float = 5.0,
        reconnect: bool = True,
        batch_size: int = 512,
        on_digest: Callable[[Digest], None] | None = None,
        wait_ready_s: float | None = None,
        defer_writes: bool = False,
        max_backoff_s: float = 2.0,
        check_interval_s: float = 2.0,
    ) -> None:
        self.address = address
        self.p4info = p4info if isinstance(p4info, P4Info) else P4Info.load(p4info)
        if device_config is None:
            self.device_config = b""
        elif isinstance(device_config, bytes):
            self.device_config = device_config
        else:
            self.device_config = Path(device_config).read_bytes()
        self.device_id = device_id
        self.election_id = election_id
        self.timeout_s = timeout_s
        self.reconnect = reconnect
        self.batch_size = batch_size
        self.on_digest = on_digest
        self.wait_ready_s = timeout_s if wait_ready_s is None else wait_ready_s
        self.defer_writes = defer_writes
        self.max_backoff_s = max_backoff_s
        self.check_interval_s = check_interval_s
        #: Digest lists received (already acked to the switch), oldest first.
        self.digests: queue.Queue[Digest] = queue.Queue()
        #: PacketIns received, oldest first.
        self.packet_ins: queue.Queue[PacketIn] = queue.Queue()
        #: Reconnects performed (each followed by a resync).
        self.reconnects = 0
        #: Table/group updates the switch refused or never got (their Write RPC failed).
        self.write_errors = 0
        #: Switch instances seen: bumped when the switch runs no pipeline, another one, or ours
        #: pushed by someone else (a restart); its registers and counters started from zero.
        self.instance = 0
        #: Whether the first connect found this pipeline already running (a warm switch).
        self.adopted = False
        self.pipeline_id = pipeline_id(self.p4info.message.SerializeToString(deterministic=True),
                                       self.device_config)
        #: The cookie of the pipeline instance this driver knows (pushed or adopted).
        self.cookie = make_cookie(self.pipeline_id)
        self._intended = _Intended()
        self._lock = threading.RLock()  # guards the intended state and serialises writes with resync
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._requests: queue.Queue[Any] | None = None
        self._arbitration: queue.Queue[Any] = queue.Queue()
        self._connected = threading.Event()  # stream up and arbitration answered
        self._ready = threading.Event()  # connected and resynced: callers may use the switch
        self._resync_thread: int | None = None
        self._lost = threading.Event()
        self._closed = threading.Event()
        self._is_master = False
        self._promoted = threading.Event()  # became master after being a backup: resync due
        self._manage = True  # resync (pipeline + state) on connect, reconnect and promotion
        self._watcher: threading.Thread | None = None
        self._session = 0  # bumped at every successful open: a call spans one session or fails
        self._ever_connected = False
        self._down_since: float | None = time.time()
        self._last_error: str | None = None
        self._resyncing = False
        self._pending = False  # intended state changed while the switch was down


    # --- connection ------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        """True while this controller holds mastership of the switch."""
        return self._is_master and self._connected.is_set()

    @property
    def connected(self) -> bool:
        """True while the stream channel to the switch is up."""
        return self._connected.is_set()

    @property
    def ready(self) -> bool:
        """True while the switch is connected and resynced: calls go through now."""
        return self._ready.is_set()

    def health(self) -> dict[str, Any]:
        """For status: state (up, backup, resyncing, connecting, down), down since, last error, counts."""
        if self._ready.is_set():
            state = "up" if self._is_master or not self._manage else "backup"
        elif self._resyncing:
            state = "resyncing"
        elif self._connected.is_set():
            state = "connecting"
        else:
            state = "down"
        return {"state": state, "down_since": None if state in ("up", "backup") else self._down_since,
                "last_error": self._last_error, "reconnects": self.reconnects, "write_errors": self.write_errors,
                "instance": self.instance, "adopted": self.adopted}

    def runs_our_pipeline(self, cookie: int | None) -> bool:
        """True when ``cookie`` names this driver's pipeline (whoever pushed it)."""
        return cookie is not None and cookie >> NONCE_BITS == self.pipeline_id

    def connect(self, push_pipeline: bool = True, retry_in_background: bool = False) -> Self:
        """Open the channel, win arbitration, push the pipeline if needed and resync; returns self.

        Raises SwitchUnreachableError when the switch does not answer within ``timeout_s`` and
        NotMasterError when a controller with a higher election id holds the switch. With
        ``retry_in_background`` an unreachable switch is retried for ever by the watcher
        (the error is still raised, so the caller can say so).
        """
        self._closed.clear()
        self._manage = push_pipeline
        try:
            self._open()
        except NotMasterError:
            self._ready.set()  # a backup may still read, and is resynced if promoted
            self._start_watcher()
            raise
        except SwitchUnreachableError as e:
            self._note_error(e)
            if retry_in_background and self.reconnect:
                self._lost.set()
                self._start_watcher()
            raise
        if push_pipeline:
            self._resync_as_owner(mark_ready=True)
        else:
            self._ready.set()
            self._down_since = None
        self._start_watcher()
        return self

    def _start_watcher(self) -> None:
        if self.reconnect and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name=f"p4rt-watch-{self.address}", daemon=True)
            self._watcher.start()

    def _note_error(self, e: BaseException) -> None:
        self._last_error = str(e).splitlines()[0] if str(e) else type(e).__name__

    def _mark_lost(self, why: str) -> None:
        """The session is gone (stream dropped, or the switch does not know us): reconnect."""
        if self._connected.is_set() or self._ready.is_set():
            log.warning("switch %s: connection lost (%s)", self.address, why)
        self._last_error = why
        self._connected.clear()
        self._ready.clear()
        self._is_master = False
        if self._down_since is None:
            self._down_since = time.time()
        self._lost.set()

    def _open(self) -> None:
        self._teardown()
        channel = grpc.insecure_channel(self.address, options=channel_options(self.max_backoff_s))
        try:
            grpc.channel_ready_future(channel).result(timeout=self.timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} did not answer within "
                                         f"{self.timeout_s:.1f} s (is simple_switch_grpc or kvpool-switch running "
                                         "there?)", "UNAVAILABLE", self.address) from None
        self._channel = channel
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        requests: queue.Queue[Any] = queue.Queue()
        self._requests = requests
        self._arbitration = queue.Queue()

        def request_iter() -> Iterator[Any]:
            while True:
                msg = requests.get()
                if msg is None:
                    return
                yield msg

        stream = self._stub.StreamChannel(request_iter())
        threading.Thread(target=self._receive, args=(stream, requests), name=f"p4rt-recv-{self.address}",
                         daemon=True).start()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election_id
        requests.put(req)
        try:
            reply = self._arbitration.get(timeout=self.timeout_s)
        except queue.Empty:
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: no arbitration reply within "
                                         f"{self.timeout_s:.1f} s", "DEADLINE_EXCEEDED", self.address) from None
        if reply is None:
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} closed the stream before "
                                         "arbitration", "UNAVAILABLE", self.address)
        if isinstance(reply, grpc.RpcError):
            self._teardown()
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} refused the stream: "
                                         f"{reply.code().name}: {reply.details()}", reply.code().name, self.address)
        self._session += 1
        self._lost.clear()
        self._connected.set()
        if not self._is_master:
            raise NotMasterError(f"switch {self.address}: election id {self.election_id} is not the highest "
                                 f"({reply.arbitration.status.message}); this controller is a backup",
                                 "PERMISSION_DENIED", self.address)

    def _receive(self, stream: Any, requests: queue.Queue[Any]) -> None:
        try:
            for msg in stream:
                kind = msg.WhichOneof("update")
                if kind == "arbitration":
                    was_master = self._is_master
                    self._is_master = msg.arbitration.status.code == code_pb2.OK
                    if self._is_master and not was_master and self._connected.is_set():
                        self._promoted.set()
                    self._arbitration.put(msg)
                elif kind == "digest":
                    self._handle_digest(msg.digest, requests)
                elif kind == "packet":
                    self._handle_packet_in(msg.packet)
                elif kind == "error":
                    log.warning("switch %s stream error: %s", self.address, msg.error.message)
        except grpc.RpcError as e:
            if not self._connected.is_set():
                self._arbitration.put(e)
            elif not self._closed.is_set():
                self._last_error = f"stream channel dropped ({e.code().name})"
        finally:
            self._arbitration.put(None)  # unblocks a connect waiting for its arbitration reply
            if self._requests is requests and not self._closed.is_set():
                self._mark_lost(self._last_error or "stream channel ended")

    def _handle_digest(self, msg: Any, requests: queue.Queue[Any]) -> None:
        try:
            info, items = codec.decode_digest_list(self.p4info, msg)
        except P4InfoError:
            log.warning("switch %s sent a digest with unknown id %d", self.address, msg.digest_id)
            return
        digest = Digest(info.name, int(msg.list_id), items, int(msg.timestamp))
        if self.on_digest is not None:
            try:
                self.on_digest(digest)
            except Exception:  # the callback's bug must not kill the stream
                log.exception("digest callback failed")
        else:
            self.digests.put(digest)
        ack = p4runtime_pb2.StreamMessageRequest()
        ack.digest_ack.digest_id = info.id
        ack.digest_ack.list_id = msg.list_id
        requests.put(ack)

    def _handle_packet_in(self, msg: Any) -> None:
        try:
            meta = codec.decode_packet_metadata(self.p4info, "packet_in", msg.metadata)
        except CodecError as e:  # the switch runs another program than our P4Info says
            log.warning("switch %s sent a packet-in this P4Info cannot read (%s); dropped", self.address, e)
            return
        self.packet_ins.put(PacketIn(bytes(msg.payload), meta))

    def _watch(self) -> None:
        """Reconnect + resync after a dropped channel (backoff, for ever); resync on promotion or a new instance."""
        delay = 0.1
        failures = 0
        next_check = time.monotonic() + self.check_interval_s
        while not self._closed.is_set():
            if self._promoted.is_set() and self._connected.is_set() and self._manage:
                self._promoted.clear()
                try:
                    self._resync_as_owner(mark_ready=True)
                    log.info("switch %s: promoted to master and resynced", self.address)
                except Exception as e:  # keep watching; the next promotion or reconnect retries
                    self._note_error(e)
                    log.warning("switch %s: resync after promotion failed: %s", self.address, e)
            if not self._lost.wait(timeout=0.1) or self._closed.is_set():
                if self._manage and self._ready.is_set() and time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.check_interval_s
                    self._check_instance()
                continue
            try:
                self._open()
                if self._manage:
                    self._resync_as_owner(mark_ready=True)
                else:
                    self._ready.set()
                    self._down_since = None
                self.reconnects += 1
                log.info("switch %s: reconnected and resynced (instance %d)", self.address, self.instance)
                delay, failures = 0.1, 0
            except NotMasterError:
                # Connected as a backup: usable for reads; a promotion triggers the resync.
                self._ready.set()
                self.reconnects += 1
                log.info("switch %s: reconnected as backup", self.address)
            except Exception as e:  # anything else: the switch is not usable yet, try again later
                self._note_error(e)
                failures += 1
                # Say it once loudly, then quietly: a switch down for minutes must not flood the log.
                (log.warning if failures == 1 else log.debug)(
                    "switch %s: reconnect failed (%s); retrying in %.1f s", self.address,
                    str(e).splitlines()[0], delay)
                self._connected.clear()
                self._lost.set()
                # Jitter keeps many controllers (or switches) from retrying in lockstep.
                self._closed.wait(delay * random.uniform(0.8, 1.2))
                delay = min(self.max_backoff_s, delay * 2)

    def _check_instance(self) -> None:
        """Resync when the switch runs another pipeline instance than ours (pushed by someone else)."""
        # Under the lock: a push of ours in flight (clean_slate) changes the switch's cookie
        # before ours is updated, and BMv2 answers "none" while it loads the new program; read
        # then, either looked like someone else's push (a spurious resync and a new instance).
        with self._lock:
            try:
                cookie = self.switch_cookie()
            except P4RuntimeError as e:
                self._note_error(e)
                return
            ours = self.cookie
        if cookie == ours:
            return
        log.warning("switch %s: runs pipeline cookie %s, not ours (%#x): someone else pushed it; resyncing",
                    self.address, "none" if cookie is None else f"{cookie:#x}", ours)
        try:
            self._resync_as_owner(mark_ready=True)
        except Exception as e:
            self._note_error(e)
            self._mark_lost(f"resync after a foreign pipeline push failed: {self._last_error}")

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Block until the switch is connected and resynced (after a reconnect); False on timeout."""
        return self._ready.wait(self.timeout_s if timeout_s is None else timeout_s)

    def _resync_as_owner(self, mark_ready: bool = False) -> None:
        """Resync holding the lock; ``mark_ready`` opens the switch to callers before the lock is released.

        Setting ready inside the lock is what makes deferred writes safe: a writer that sees
        the switch not ready (under the lock) knows a resync has still to run and will apply
        its change to the intended state.
        """
        with self._lock:
            self._resync_thread = threading.get_ident()
            self._resyncing = True
            try:
                self.resync()
                if mark_ready:
                    self._pending = False
                    self._ready.set()
                    self._down_since = None
            finally:
                self._resyncing = False
                self._resync_thread = None

    def _teardown(self) -> None:
        self._connected.clear()
        self._ready.clear()
        requests, self._requests = self._requests, None
        if requests is not None:
            requests.put(None)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def close(self) -> None:
        """Close the stream and channel and stop reconnecting."""
        self._closed.set()
        self._lost.set()
        self._teardown()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- RPC plumbing ----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        """Wait (outside the lock) for a reconnect + resync in progress, up to ``wait_ready_s``."""
        if self._resync_thread == threading.get_ident() or self._ready.is_set():
            return
        if self.wait_ready_s <= 0 or not self._ready.wait(self.wait_ready_s):
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected"
                                         + (f" (waited {self.wait_ready_s:.1f} s for a reconnect)"
                                            if self.wait_ready_s > 0 else "")
                                         + (f"; last error: {self._last_error}" if self._last_error else ""),
                                         "UNAVAILABLE", self.address)

    def _require(self) -> tuple[Any, int]:
        """(stub, session) for a call made now: resync may use a connected switch, callers need a resynced one."""
        event = self._connected if self._resync_thread == threading.get_ident() else self._ready
        if not event.is_set():
            self._wait_ready()
        stub, session = self._stub, self._session
        if stub is None or not self._connected.is_set():
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected", "UNAVAILABLE",
                                         self.address)
        return stub, session

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(stub)`` within one session: if the connection dropped meanwhile, the answer is discarded.

        gRPC reconnects a channel by itself, so without this a call could reach a new switch
        process (a restarted switch) and read its empty state as ours.
        """
        stub, session = self._require()
        try:
            result = fn(stub)
        except grpc.RpcError as e:
            raise self._rpc_error(what, e) from None
        if session != self._session or not self._connected.is_set():
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: the connection dropped during "
                                         f"{what}; its answer was discarded (the switch may have restarted)",
                                         "UNAVAILABLE", self.address)
        return result

    def _election_msg(self, msg: Any) -> None:
        msg.high, msg.low = self.election_id

    def _rpc_error(self, what: str, e: grpc.RpcError) -> P4RuntimeError:
        code = e.code()
        name = code.name
        details = e.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            err: P4RuntimeError = SwitchUnreachableError(f"P4Runtime switch at {self.address} unavailable ({what}): "
                                                         f"{name}: {details}", name, self.address)
            self._mark_lost(f"{what}: {name}")
        elif code == grpc.StatusCode.PERMISSION_DENIED:
            err = NotMasterError(f"switch {self.address} refused {what}: {details}", name, self.address)
            if self._is_master:
                # We hold the primary's stream as far as we know: the switch answering is not the
                # one we arbitrated with (a restarted process behind a silently reconnected channel).
                self._mark_lost(f"{what} refused although this controller is primary (switch restarted?)")
        elif code == grpc.StatusCode.FAILED_PRECONDITION:
            err = NoPipelineError(f"switch {self.address}: {what} failed: the switch runs no pipeline ({details}); "
                                  "it restarted, a resync pushes ours", name, self.address)
            if self._manage:
                self._mark_lost(f"{what}: the switch runs no pipeline")
        else:
            err = P4RuntimeCallError(f"switch {self.address}: {what} failed: {name}: {details}", name, self.address)
        self._note_error(err)
        return err

    # --- pipeline --------------------------------------------------------------------------------

    def _pipeline_config(self, response_type: int) -> Any | None:
        """GetForwardingPipelineConfig's config (``response_type`` of it); None when the switch runs none."""
        req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=self.device_id, response_type=response_type)
        stub, session = self._require()
        try:
            resp = stub.GetForwardingPipelineConfig(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None
            raise self._rpc_error("GetForwardingPipelineConfig", e) from None
        if session != self._session:
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address}: the connection dropped while reading "
                                         "its pipeline config", "UNAVAILABLE", self.address)
        return resp.config

    def switch_cookie(self) -> int | None:
        """Cookie of the pipeline the switch runs; None when it runs none or one set without a cookie."""
        config = self._pipeline_config(p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
        if config is None or not config.HasField("cookie"):
            return None
        return int(config.cookie.cookie)


    def _has_pipeline(self) -> bool:
        """Whether the switch runs a pipeline at all (one pushed without a cookie counts)."""
        config = self._pipeline_config(p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE)
        return config is not None and bool(config.HasField("p4info"))


    def _table(self, name: str | int) -> TableInfo:
        return self.p4info.table(name)

    # --- packet-out ------------------------------------------------------------------------------

    def send_packet_out(self, payload: bytes, **metadata: int) -> None:
        """Send a packet through the switch's CPU port with ``packet_out`` header fields by name."""
        req = p4runtime_pb2.StreamMessageRequest()
        req.packet.payload = payload
        codec.encode_packet_metadata(self.p4info, "packet_out", metadata, req.packet.metadata)
        self._require()
        requests = self._requests
        if requests is None:
            raise SwitchUnreachableError(f"P4Runtime switch at {self.address} is not connected")
        requests.put(req)

    # --- resync (the subclass's) -----------------------------------------------------------------

    def resync(self) -> dict[str, int]:
        """Make the switch match the intended state; :class:`~controller.p4runtime.P4RuntimeSwitch` does it."""
        raise NotImplementedError
