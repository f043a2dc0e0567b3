"""The controller daemon's local API: HTTP/1.1 + JSON, on loopback TCP and optionally a Unix socket.

HTTP/JSON rather than gRPC because every other local API of kvpool (the agent's) is
HTTP/JSON, the CLI and shell scripts need nothing beyond the standard library, and agents
inside Mininet hosts (other network namespaces, same filesystem) reach it through a Unix
socket (mode 0660).

Authentication (docs/guide/operations.md, "Threat model"): reads are open; every other call needs
the operator's token (``Authorization: Bearer``, ``kvpool.auth``), 401 without it. The
directory calls are the exception for an agent on another host: it registers itself and
speaks for itself without the token, and is known by its address instead (the peer must
be the address registered). Registering answers a per-node credential that every later
call for that node must carry (``X-Kvpool-Node-Credential``): nobody else can heartbeat,
publish, withdraw or deregister for it, nor register its node id while it is live.

It never blocks the policy epoch loop: reads come from the snapshot the loop publishes at
the end of each epoch (``Controller.snapshot``) or go straight to a switch over
P4Runtime (``stats``, the pipeline check of ``status``); operator overrides are queued and
applied by the loop at the start of its next epoch, while the request's thread waits for
the outcome (at most ``override_timeout_s``). Directory calls touch only the directory.

Chunk keys are 64-bit, written as hex strings (``"0x1f..."``; bare hex accepted).

The endpoints, their bodies and answers, and the error codes: docs/design/notes-controller-api.md.
``GET /metrics`` (open, as every read) answers ``/v1/stats``' counters and the loop's in Prometheus' text
format (``controller.metrics``, docs/reference/metrics.md).

"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from controller import api_models as m
from controller import metrics
from controller.counters import read_stats
from controller.daemon import Controller
from controller.directory import (
    BAD_CREDENTIAL,
    BAD_REQUEST,
    NODE_DOWN,
    NODE_LIVE,
    OVER_CAPACITY,
    REFUSED,
    UNKNOWN_NODE,
    DirectoryError,
    Role,
)
from controller.overrides import Override, OverrideRefusedError
from controller.p4runtime import SwitchUnreachableError
from controller.settings import ControllerError
from kvpool import auth, wire
from kvpool.auth import Token
from kvpool.http_api import TEXT, ApiError, Auth, Doc, Request, Response, Router, is_remote
from kvpool.http_server import ApiServer
from kvpool.metrics import exposition, registry

log = logging.getLogger("kvpool.controller.api")

#: Default TCP port of the controller API (the agent's API uses 7471; the data plane 7470).
DEFAULT_PORT = 7480
MAX_BODY = 1 << 20
SORT_KEYS = ("value", "hits", "fetches", "estimate")

_DIRECTORY_STATUS = {BAD_REQUEST: HTTPStatus.BAD_REQUEST, REFUSED: HTTPStatus.FORBIDDEN,
                     UNKNOWN_NODE: HTTPStatus.NOT_FOUND, NODE_DOWN: HTTPStatus.GONE,
                     OVER_CAPACITY: HTTPStatus.CONFLICT, NODE_LIVE: HTTPStatus.CONFLICT,
                     BAD_CREDENTIAL: HTTPStatus.FORBIDDEN}


def parse_key(text: object) -> int:
    """A 64-bit chunk key from ``"0x..."`` or bare hex; ApiError (400) otherwise."""
    if not isinstance(text, str):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", f"key {text!r}: expected a hex string")
    try:
        key = int(text, 16)
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", f"key {text!r} is not hex") from None
    if not 0 <= key < 1 << 64:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", f"key {text!r} does not fit 64 bits")
    return key


def _int(doc: dict[str, Any], name: str, default: int | None = None, minimum: int = 0) -> int:
    value = doc.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", f"{name}: expected an integer >= {minimum}, "
                                                              f"got {value!r}")
    return value


def _keys(doc: dict[str, Any]) -> list[int]:
    keys = doc.get("keys")
    if not isinstance(keys, list):
        raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "keys: expected a list of hex strings")
    return [parse_key(k) for k in keys]


TITLE = "kvpool controller API"
DESCRIPTION = ("The operator's API to the kvpool controller (status, overrides) and the agents' directory "
               "(register, publish, withdraw). Every call but GET needs the operator's token; a node on another "
               "host speaks for itself with its node credential instead. docs/design/notes-controller-api.md")


class ControllerAPI:
    """The HTTP servers (TCP, and a Unix socket when asked) in front of one Controller."""

    def __init__(self, controller: Controller, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 unix_path: Path | None = None, override_timeout_s: float | None = None,
                 token: Token | None = None) -> None:
        self.controller = controller
        self.host = host
        self.override_timeout_s = override_timeout_s or max(5.0, 10 * controller.settings.epoch_s)
        self.unix_path = unix_path
        #: what every call but GET must present (default: the operator's token file, made if missing)
        self.token = token or auth.load_or_create()
        #: this controller's own Prometheus registry, read at scrape time (``controller.metrics``)
        self.registry = registry(metrics.collector(self.metrics_snapshot))
        self.server = ApiServer(self.router(), host, port, token=self.token, unix_path=unix_path,
                                max_body_bytes=MAX_BODY, name="kvpool-controller", title=TITLE,
                                description=DESCRIPTION)

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful with port 0)."""
        return self.server.port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the TCP server."""
        return self.server.url

    def start(self) -> ControllerAPI:
        """Serve in background threads; returns self."""
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the sockets (removes the Unix socket file)."""
        self.server.stop()

    def router(self) -> Router:
        """Every endpoint of the module docstring, routed."""
        d = self.controller.directory

        def get(fn: Callable[[], dict[str, Any]]) -> Callable[[Request], Response]:
            return lambda _req: Response.json(fn())

        r = Router()
        r.add("GET", "/v1/status", get(self.status), doc=Doc("The loop, the switches, the pool", answer=m.Status))
        r.add("GET", "/v1/tiers", get(self.tiers), doc=Doc("Capacity and use per tier", answer=m.Tiers))
        r.add("GET", "/v1/stats", get(self.stats), doc=Doc("The switches' counters and the loop's", answer=m.Stats))
        r.add("GET", "/metrics", self._metrics, doc=Doc("The counters in Prometheus' text format",
                                                        answer=TEXT))  # a read, open as /v1/stats is
        r.add("GET", "/v1/nodes", get(lambda: {"nodes": d.nodes()}), doc=Doc("The directory's nodes", answer=m.Nodes))
        r.add("GET", "/v1/top", self._top, doc=Doc("The most valuable chunks", answer=m.Top, query={
            "sort": f"one of {', '.join(SORT_KEYS)} (default value)", "limit": "how many (default 20)"}))
        r.add("GET", "/v1/switches/{name}", lambda req: Response.json(self.switch(req.params["name"])),
              doc=Doc("One switch's state", answer=m.Switch))
        r.add("GET", "/v1/chunks/{key}", lambda req: Response.json(self.chunk(parse_key(req.params["key"]))),
              doc=Doc("Where one chunk is and what it is worth", answer=m.Chunk))
        for op in ("admit", "evict", "pin", "unpin", "quota", "republish"):
            r.add("POST", f"/v1/{op}", functools.partial(self._override, op=op),
                  doc=Doc(f"Override: {op} (applied by the next epoch)", body=m.Override, answer=m.OverrideAnswer))
        # An agent on another host registers and speaks for itself without the operator's token:
        # its address proves who it is (register: the address claimed; later calls: the node's).
        node = Auth.LOCAL_TOKEN
        cred = {auth.NODE_CREDENTIAL_HEADER: "the node's credential, from its registration"}
        r.add("POST", "/v1/nodes/register",
              _directory(lambda req: self.register(req.json(), req.peer, _credential(req))), node,
              Doc("Register a node", body=m.Register, answer=m.Registered, headers=cred))
        r.add("DELETE", "/v1/nodes/{node}", _directory(self._node_call(self._deregister)), node,
              Doc("Deregister a node", answer=m.Deregistered, headers=cred))
        r.add("POST", "/v1/nodes/{node}/heartbeat", _directory(self._node_call(self._heartbeat)), node,
              Doc("A node is alive", answer=m.Heartbeat, headers=cred))
        r.add("POST", "/v1/nodes/{node}/publish", _directory(self._node_call(self._publish)), node,
              Doc("A node holds chunks", body=m.Publish, answer=m.Published, headers=cred))
        r.add("POST", "/v1/nodes/{node}/withdraw", _directory(self._node_call(self._withdraw)), node,
              Doc("A node no longer holds chunks", body=m.Withdraw, answer=m.Withdrawn, headers=cred))
        r.add("POST", "/v1/nodes/{node}/versions", _directory(self._node_call(self._versions)), node,
              Doc("A holder's chunks and their digests: their generations back", body=m.Versions,
                  answer=m.Generations, headers=cred))
        r.add("GET", "/v1/generations", _directory(self._generations), Auth.NONE,
              Doc("Current generations of chunks", answer=m.Generations, query={"keys": "hex keys, comma-separated"}))
        return r

    def _metrics(self, req: Request) -> Response:
        body, content_type = exposition(self.registry, req.header("Accept"))
        return Response(HTTPStatus.OK, [body], content_type)

    def _top(self, req: Request) -> Response:
        try:
            limit = int(req.arg("limit", "20"))
        except ValueError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "limit: expected an integer") from None
        if limit < 1:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "limit: expected an integer >= 1")
        return Response.json(self.top(req.arg("sort", "value"), limit))

    def _override(self, req: Request, op: str) -> Response:
        return Response.json(self.override(req.json(), op))

    def _node_call(self, fn: Callable[[Request], dict[str, Any]]) -> Callable[[Request], dict[str, Any]]:
        """A call for one node: from another host, only from that node's address (and always with its credential)."""

        def call(req: Request) -> dict[str, Any]:
            address = self.controller.directory.address_of(req.params["node"])
            if is_remote(req.peer) and address is not None and req.peer != address:
                raise ApiError(HTTPStatus.FORBIDDEN, REFUSED,
                               f"node {req.params['node']!r} is at {address}; this call came from {req.peer}")
            return fn(req)

        return call

    def _deregister(self, req: Request) -> dict[str, Any]:
        self.controller.directory.deregister(req.params["node"], _credential(req))
        return {"deregistered": req.params["node"]}

    def _heartbeat(self, req: Request) -> dict[str, Any]:
        self.controller.directory.heartbeat(req.params["node"], _credential(req))
        return {"ok": True}

    def _publish(self, req: Request) -> dict[str, Any]:
        body = req.json()
        tier = body.get("tier")
        if not isinstance(tier, str):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "tier: expected a tier name")
        gens = body.get("generations", {})
        if not isinstance(gens, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "generations: expected {hex key: generation}")
        generations = {parse_key(k): _int(gens, k) for k in gens}
        return {"new": self.controller.directory.publish(req.params["node"], _keys(body), tier, _int(body, "nbytes"),
                                                         _credential(req), generations)}

    def _versions(self, req: Request) -> dict[str, Any]:
        """Generations for a holder's chunks, per content; a changed content moves every switch first."""
        node_id = req.params["node"]
        self.controller.directory.heartbeat(node_id, _credential(req))  # a live node, and really that node
        if self.controller.directory.role_of(node_id) is not Role.HOLDER:
            raise ApiError(HTTPStatus.FORBIDDEN, REFUSED, f"node {node_id!r} is not a holder: only holders publish "
                                                          "new content")
        chunks = req.json().get("chunks")
        if not isinstance(chunks, list) or not all(isinstance(c, dict) for c in chunks):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request",
                           "versions: expected {chunks: [{key: hex, digest: hex, nbytes: int}, ...]}")
        out: dict[str, int] = {}
        for c in chunks:
            key, digest, nbytes = parse_key(c.get("key")), parse_key(c.get("digest")), _int(c, "nbytes", minimum=1)
            version, previous = self.controller.directory.issue(key, digest, nbytes)
            if previous is not None:
                # Republished with other bytes: every switch moves off the old ones before we answer.
                self.override({"key": f"{key:#x}", "generation": version.generation, "nbytes": nbytes},
                              "republish")
                log.info("chunk %#x republished by %s: generation %d -> %d", key, node_id, previous.generation,
                         version.generation)
            out[f"{key:#x}"] = version.generation
        return {"generations": out}

    def _generations(self, req: Request) -> dict[str, Any]:
        """Current generation of each key of ``?keys=hex,hex,...`` the directory knows."""
        text = req.arg("keys", "")
        keys = [parse_key(k) for k in text.split(",") if k]
        if len(keys) > 4096:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "generations: at most 4096 keys per call")
        gens = self.controller.directory.generations(keys)
        return {"generations": {f"{k:#x}": g for k, g in gens.items()}}

    def _withdraw(self, req: Request) -> dict[str, Any]:
        body = req.json()
        tier = body.get("tier")
        if tier is not None and not isinstance(tier, str):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", "tier: expected a tier name or null")
        return {"removed": self.controller.directory.withdraw(req.params["node"], _keys(body), tier,
                                                              _credential(req))}

    # ------------------------------------------------------------------ reads
    def status(self) -> dict[str, Any]:
        """Switches (with a live pipeline check), controller epoch, pool, nodes up/down."""
        ctl = self.controller
        snap = ctl.snapshot
        st = dict(snap.get("status", {}))
        pool = st.get("pool", {"slots": ctl.settings.pool_slots, "used": 0, "chunks": 0})
        switches: dict[str, Any] = {}
        for name, ep in ctl.endpoints.items():
            sw = ctl.switches.get(name)
            entry: dict[str, Any] = {"address": ep.address, "device_id": ep.device_id,
                                     "connected": bool(sw and sw.connected), "master": bool(sw and sw.is_master),
                                     "slots": {"total": pool["slots"], "used": pool["used"],
                                               "free": pool["slots"] - pool["used"]}}
            # up / backup / resyncing / connecting / down, since when, the last error, reconnects.
            entry.update(sw.health() if sw is not None else {"state": "down", "down_since": None,
                                                             "last_error": "not started"})
            pipeline: dict[str, Any] = {"p4info": ctl.settings.p4info.name, "installed": False}
            if sw is not None:
                pipeline["cookie"] = f"{sw.cookie:#x}"
                if sw.connected:
                    try:
                        pipeline["installed"] = sw.switch_cookie() == sw.cookie
                    except (SwitchUnreachableError, OSError) as exc:
                        entry["error"] = str(exc)
            entry["pipeline"] = pipeline
            switches[name] = entry
        st["switches"] = switches
        st["failed_epochs"] = ctl.failed_epochs
        st["last_epoch_error"] = ctl.last_epoch_error
        st["target"] = ctl.settings.target
        st["nodes"] = ctl.directory.counts()
        st.setdefault("epoch", ctl.epoch)
        st.setdefault("mode", str(ctl.settings.mode))
        st["pool"] = pool
        return st

    def top(self, sort: str, limit: int) -> dict[str, Any]:
        """Chunks hottest first by ``sort``, at most ``limit``."""
        if sort not in SORT_KEYS:
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request", f"sort {sort!r}: expected one of "
                                                                  f"{', '.join(SORT_KEYS)}")
        snap = self.controller.snapshot
        rows = sorted(snap.get("chunks", []), key=lambda r: (-r[sort], -r["fetches"], r["key"]))
        return {"epoch": snap.get("status", {}).get("epoch", 0), "sort": sort, "chunks": rows[:limit]}

    def tiers(self) -> dict[str, Any]:
        """Node tiers from the directory plus the switch tier."""
        ctl = self.controller
        out: dict[str, Any] = {t: dict(v) for t, v in ctl.directory.tiers().items()}
        pool = ctl.snapshot.get("status", {}).get("pool", {"used": 0, "chunks": 0})
        n_sw = len(ctl.endpoints)
        out["switch"] = {"capacity": ctl.settings.pool_slots * wire.FRAG_PAYLOAD * n_sw,
                         "used": pool["used"] * wire.FRAG_PAYLOAD * n_sw, "chunks": pool["chunks"] * n_sw,
                         "nodes": n_sw}
        return {"tiers": out}

    def stats(self) -> dict[str, Any]:
        """Data-plane counters of every switch, read now."""
        out: dict[str, Any] = {}
        for name in self.controller.endpoints:
            sw = self.controller.switches.get(name)
            if sw is None or not sw.connected:
                # Do not wait for the driver's reconnect timeout: the operator wants an answer now.
                out[name] = {"error": f"switch {name} at {self.controller.endpoints[name].address} is not connected"}
                continue
            try:
                out[name] = read_stats(sw)
            except (SwitchUnreachableError, OSError) as exc:
                out[name] = {"error": str(exc)}
        return {"switches": out}

    def metrics_snapshot(self) -> dict[str, Any]:
        """What ``/metrics`` shows (``controller.metrics``): ``/v1/stats``' counters read now, each driver's
        health, the loop's and the policy's counters, the directory's nodes and the API's own counters."""
        ctl = self.controller
        snap = ctl.snapshot
        health: dict[str, Any] = {}
        for name in ctl.endpoints:
            sw = ctl.switches.get(name)
            health[name] = ({"connected": False, "master": False, "reconnects": 0, "write_errors": 0} if sw is None
                            else {"connected": sw.connected, "master": sw.is_master, **sw.health()})
        st = snap.get("status", {})
        return {"switches": self.stats()["switches"], "health": health,
                "pool": st.get("pool", {"slots": ctl.settings.pool_slots, "used": 0, "chunks": 0}),
                "controller": {"epoch": ctl.epoch, "failed_epochs": ctl.failed_epochs,
                               "catalog": st.get("catalog", len(ctl.catalog))},
                "policy": snap.get("policy", {}), "nodes": ctl.directory.counts(),
                "api": self.server.counters.snapshot()}

    def switch(self, name: str) -> dict[str, Any]:
        """Where switch ``name`` listens and which P4Info it runs."""
        ctl = self.controller
        ep = ctl.endpoints.get(name)
        if ep is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "unknown_switch",
                           f"no switch {name!r} (switches: {', '.join(sorted(ctl.endpoints))})")
        bmv2 = ctl.settings.bmv2_json
        return {"name": name, "address": ep.address, "device_id": ep.device_id,
                "p4info": str(ctl.settings.p4info.resolve()),
                "bmv2_json": str(bmv2.resolve()) if bmv2 is not None and bmv2.exists() else None}

    def chunk(self, key: int) -> dict[str, Any]:
        """Holders of ``key`` and its switch row."""
        ctl = self.controller
        holders = [h.as_dict() for h in ctl.directory.holders(key)]
        row = next((r for r in ctl.snapshot.get("chunks", []) if r["key"] == f"{key:#x}"), None)
        if not holders and row is None and ctl.catalog.get(key) is None:
            raise ApiError(HTTPStatus.NOT_FOUND, "unknown_key", f"chunk {key:#x} is unknown to the controller")
        return {"key": f"{key:#x}", "holders": holders, "switch": row}

    # ------------------------------------------------------------------ overrides
    def override(self, doc: dict[str, Any], op: str) -> dict[str, Any]:
        """Queue one override for the epoch loop and wait for its outcome."""
        if op == "quota":
            slots = doc.get("slots")
            ov = Override("quota", tenant=_int(doc, "tenant"),
                          slots=None if slots is None else _int(doc, "slots", minimum=1))
        elif op == "republish":
            ov = Override("republish", parse_key(doc.get("key")), generation=_int(doc, "generation"),
                          nbytes=_int(doc, "nbytes", minimum=1))
        else:
            key = parse_key(doc.get("key"))
            demote = True
            if op == "evict":
                action = doc.get("action", "demote")
                if action not in ("demote", "drop"):
                    raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request",
                                   f"action {action!r}: expected demote or drop")
                demote = action == "demote"
            ov = Override(op, key, demote=demote, tenant=_int(doc, "tenant", 0))
        fut = self.controller.submit(ov)
        try:
            return fut.result(timeout=self.override_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ApiError(HTTPStatus.GATEWAY_TIMEOUT, "timeout",
                           f"the epoch loop did not apply the {op} within {self.override_timeout_s:g} s "
                           "(is the daemon running epochs?)") from None
        except OverrideRefusedError as exc:
            raise ApiError(HTTPStatus.CONFLICT, exc.code, str(exc)) from None
        except SwitchUnreachableError as exc:
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE, "switch_unreachable", str(exc)) from None
        except ControllerError as exc:
            raise ApiError(HTTPStatus.CONFLICT, "refused", str(exc)) from None

    # ------------------------------------------------------------------ directory
    def register(self, doc: dict[str, Any], peer: str | None, credential: str | None = None) -> dict[str, Any]:
        """Register an agent; over TCP from a non-loopback peer, the peer must be the claimed address.

        The answer's ``node_credential`` is what every later call for the node must carry
        (``X-Kvpool-Node-Credential``); ``credential`` is the one a live node presents to register again.
        """
        node_id, address, role = doc.get("node_id"), doc.get("address"), doc.get("role", "holder")
        tiers = doc.get("tiers", {})
        if not isinstance(node_id, str) or not isinstance(address, str) or not isinstance(role, str) \
                or not isinstance(tiers, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "bad_request",
                           "register: expected {node_id: str, address: str, role: str, tiers: {tier: bytes}}")
        if is_remote(peer) and peer != address:
            raise ApiError(HTTPStatus.FORBIDDEN, REFUSED, f"registration for {address} came from {peer}")
        node = self.controller.directory.register(node_id, address, role, tiers, credential)
        log.info("node %s registered from %s as %s (%s)", node.node_id, node.address, node.role, node.capacities)
        return {"node_id": node.node_id, "heartbeat_s": self.controller.directory.heartbeat_timeout_s / 3,
                "node_credential": node.credential}


def _directory(fn: Callable[[Request], dict[str, Any]]) -> Callable[[Request], Response]:
    """A directory endpoint: its answer as JSON, a ``DirectoryError`` as the ApiError its code maps to."""

    def handle(req: Request) -> Response:
        try:
            return Response.json(fn(req))
        except DirectoryError as exc:
            raise ApiError(_DIRECTORY_STATUS[exc.code], exc.code, str(exc)) from None

    return handle


def _credential(req: Request) -> str:
    """The node credential a directory call carries ('' when none: never the trusting None)."""
    return req.header(auth.NODE_CREDENTIAL_HEADER)
