"""The switch killed and restarted while vLLM engines load a prefix from kvpool through it.

One of ``KvpoolConnector``'s failure cases: the switch restarted mid-load. The ttft
experiment's star (``ttft.TtftRun``: holder ``h0`` publishing a shared prefix's KV as vLLM
computes it, ``N`` requesters each running ``bmv2_topologies.vllm_host`` with the connector)
in one switch mode, with the testbed's in-process controller running its epochs, so a
restarted switch is noticed and resynced as in production. Three waves of the same prompts
(the prefix and each requester's own tokens), all requesters at once:

1. ``reference``: a full prefill (a salt nothing was saved under: the lookup misses);
2. ``during``: the prefix fetched through the switch; once the holder's link has carried
   ``kill_at`` of one copy of the prefix and every requester's agent has stored part of it (each
   load is under way, none is done), the switch process is SIGKILLed and started again, empty
   (``EmulatedNetwork.restart_switch``);
3. ``after``: once a requester reaches the holder through the switch again (the controller
   reprogrammed it), the prefix fetched once more.

:func:`run_vllm_switch_restart` returns every answer (``vllm_host``'s: greedy tokens, tokens
taken from kvpool, the connector's load time, what failed to load) with the moments and the
holder-link bytes that show where the restart landed. What must hold (the test checks it):
every request completes in bounded time with the reference's tokens; in ``during`` each
request either loaded the whole prefix (the fetch survived the restart: agents retransmit what
the dead switch lost) or recomputed what did not load, never wrong KV; the kill came after the
load began and before it ended; ``after`` loads the whole prefix again.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmv2_topologies.experiment.capture import link_bytes
from bmv2_topologies.experiment.report import ModeResult
from bmv2_topologies.experiment.ttft import FRAME_OVERHEAD, TtftError, TtftRun
from bmv2_topologies.experiment.ttft_config import VLLM_BLOCK_TOKENS, TtftConfig
from bmv2_topologies.network import mininet_available
from hostagent.client import AgentClient
from kvpool import wire

log = logging.getLogger("kvpool.vllm_restart")


@dataclass
class VllmRestartResult:
    """The three waves' answers (one per requester, in order) and where the restart landed."""

    prefix_tokens: int
    prefix_fragments: int
    prefix_wire_bytes: int
    """One copy of the prefix's DATA frames on the holder's link."""
    reference: list[dict[str, Any]] = field(default_factory=list)
    during: list[dict[str, Any]] = field(default_factory=list)
    after: list[dict[str, Any]] = field(default_factory=list)
    during_began: float = 0.0
    """Wall time the ``during`` wave was sent to the hosts."""
    killed_at: float | None = None
    """Wall time of the SIGKILL (None: the load ended before the kill threshold was reached)."""
    listening_after_s: float = 0.0
    """From the kill until the new switch process listened."""
    holder_bytes_at_kill: int = 0
    """Holder-link bytes of the ``during`` wave before the kill (both directions)."""
    holder_bytes_during: int = 0
    """Holder-link bytes of the whole ``during`` wave."""
    stored_at_kill: list[int] = field(default_factory=list)
    """Per requester: prefix fragments its agent had stored in the wave before the kill."""
    stored_during: list[int] = field(default_factory=list)
    """Per requester: fragments its agent stored in the whole wave (the prefix's, when its load succeeded)."""
    retransmits_during: list[int] = field(default_factory=list)
    """Per requester: GETs its agent sent again in the wave (what the dead switch lost)."""
    answered_after_s: float = 0.0
    """From the kill until the last ``during`` answer."""
    reachable_after_s: float | None = None
    """From the kill until a requester reached the holder through the switch again (None: never)."""
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """A few lines: where the kill landed, how each request of each wave ended."""
        lines = [f"prefix {self.prefix_tokens} tokens = {self.prefix_fragments} fragments = "
                 f"{self.prefix_wire_bytes / 1e3:.0f} kB on the holder link"]
        if self.killed_at is not None:
            lines += [
                f"switch killed {self.killed_at - self.during_began:.2f} s into the load wave, after "
                f"{self.holder_bytes_at_kill / 1e3:.0f} kB of it crossed the holder link (the whole wave: "
                f"{self.holder_bytes_during / 1e3:.0f} kB)",
                f"listening again after {self.listening_after_s:.1f} s, forwarding again after "
                f"{_seconds(self.reachable_after_s)}, last answer {self.answered_after_s:.1f} s after the kill",
                f"fragments stored per requester: at the kill {self.stored_at_kill}, in the wave {self.stored_during}; "
                f"GETs retransmitted {self.retransmits_during}"]
        for name in ("reference", "during", "after"):
            for i, a in enumerate(getattr(self, name)):
                lines.append(f"{name} h{i + 1}: " + (a["error"] if "error" in a else
                             f"cached {a['cached_tokens']} tokens, load {a['fetch_ms']:.0f} ms, TTFT "
                             f"{a['ttft_ms']:.0f} ms, {a['stopped'] or 'all loaded'}"))
        return "\n".join(lines + self.errors)


class VllmRestart:
    """The ttft run's star and vLLM hosts, and the three waves around one switch restart."""

    def __init__(self, out: Path, requesters: int = 2, mode: str = "multicast", prefix_tokens: int = 512,
                 holder_mbps: float = 2.0, kill_at: float = 0.2, fetch_timeout_s: float = 30.0) -> None:
        self.cfg = TtftConfig.for_quick(engine="vllm", block_tokens=VLLM_BLOCK_TOKENS, requesters=(requesters,),
                                        modes=(mode,), schemes=("shared",), prefix_tokens=prefix_tokens,
                                        sweep_tokens=(prefix_tokens,), holder_mbps=holder_mbps,
                                        fetch_timeout_s=fetch_timeout_s)
        self.cfg.validate()
        self.kill_at = kill_at
        self.run = TtftRun(self.cfg, out, lambda m: log.info("%s", m))
        frags = self.run.fragments(prefix_tokens)
        self.result = VllmRestartResult(prefix_tokens, frags, frags * (wire.DATA_DATAGRAM_LEN + FRAME_OVERHEAD))
        self.prompts = [self.run.prompts.prompt(prefix_tokens, "restart", 0, r) for r in range(requesters)]

    def go(self) -> VllmRestartResult:
        """Bring the star and the hosts up, run the three waves in the mode, bring everything down."""
        bed, hosts = self.run.bed, self.run.hosts
        with bed.running(), hosts.running():
            bed.run_mode(self.cfg.modes[0], None, self._waves)
        return self.result

    def _waves(self, _result: ModeResult, _progress: object) -> None:
        res, hosts = self.result, self.run.hosts
        res.reference = hosts.wave(self.prompts, fetch=False, serial=False)
        ended = self._during()
        # A load that failed through the agent leaves it alone for the connector's retry_after_s (5 s).
        time.sleep(max(0.0, ended + 6.0 - time.monotonic()))
        res.after = hosts.wave(self.prompts, fetch=True, serial=False)

    def _during(self) -> float:
        """The load wave with the restart in it; the monotonic time it ended."""
        res, bed = self.result, self.run.bed
        holder_link = bed.holder_links[bed.holder.name]
        switch = next(iter(bed.topo.switches))
        base, agents = link_bytes(holder_link), self._agent_counters()
        answers: list[dict[str, Any]] = []
        answered: list[float] = []

        def wave() -> None:
            answers.extend(self.run.hosts.wave(self.prompts, fetch=True, serial=False))
            answered.append(time.time())

        thread = threading.Thread(target=wave, name="vllm-restart-wave", daemon=True)
        res.during_began = time.time()
        thread.start()
        threshold = self.kill_at * res.prefix_wire_bytes
        deadline = time.monotonic() + self.cfg.fetch_timeout_s + 60.0
        while thread.is_alive() and time.monotonic() < deadline:
            if link_bytes(holder_link) - base < threshold:
                time.sleep(0.01)
                continue
            # Every requester's load is under way (its agent stored some of the prefix): kill now.
            stored = _minus(self._agent_counters(), agents, "fragments_stored")
            if min(stored) > 0:
                res.stored_at_kill = stored
                res.killed_at, res.holder_bytes_at_kill = time.time(), link_bytes(holder_link) - base
                bed.net.restart_switch(switch)  # type: ignore[union-attr]  # the testbed is running
                res.listening_after_s = time.time() - res.killed_at
                # While the load goes on: when the controller has the new switch forwarding again.
                res.reachable_after_s = self._reachable(res.killed_at)
                break
            time.sleep(0.05)
        if res.killed_at is None:
            res.errors.append(f"the kill threshold ({threshold / 1e3:.0f} kB on the holder link and some of the "
                              "prefix at every requester) was not reached while the load wave ran: no restart "
                              "landed mid-load")
        # Bounded: each host answers within Hosts.wave's read timeout.
        thread.join(timeout=self.cfg.fetch_timeout_s + 60.0 * len(self.prompts) + 30.0)
        if thread.is_alive():
            res.errors.append("the load wave did not end: a host hung")
        if res.killed_at is not None and answered:
            res.answered_after_s = answered[0] - res.killed_at
        res.during = answers
        res.holder_bytes_during = link_bytes(holder_link) - base
        after = self._agent_counters()
        res.stored_during = _minus(after, agents, "fragments_stored")
        res.retransmits_during = _minus(after, agents, "retransmit_gets")
        return time.monotonic()

    def _agent_counters(self) -> list[dict[str, Any]]:
        """Each requester's agent's transport counters, in requester order."""
        bed = self.run.bed
        return [AgentClient(bed.api(h.name), timeout=30).stats()["transport"] for h in bed.requesters()]

    def _reachable(self, since: float, within_s: float = 60.0) -> float | None:
        """Seconds from ``since`` until the first requester pings the holder through the switch (None: not within)."""
        bed = self.run.bed
        requester = bed.requesters()[0].name
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            ping = bed.popen(requester, ["ping", "-c", "1", "-W", "1", bed.holder.address],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if ping.wait(timeout=10) == 0:
                return time.time() - since
            time.sleep(0.2)
        return None


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _minus(now: list[dict[str, Any]], then: list[dict[str, Any]], name: str) -> list[int]:
    """Per requester, how much counter ``name`` grew from ``then`` to ``now``."""
    return [int(a.get(name, 0)) - int(b.get(name, 0)) for a, b in zip(now, then, strict=True)]


def run_vllm_switch_restart(out: Path, **kwargs: Any) -> VllmRestartResult:
    """The whole run under ``out`` (needs root, Mininet and the vLLM venv; ``TtftError`` otherwise)."""
    reason = mininet_available()
    if reason:
        raise TtftError(reason)
    return VllmRestart(out, **kwargs).go()
