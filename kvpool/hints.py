"""The fabric's hints to agents: which chunks are worth asking for one fragment at a time.

The controller knows which chunks the switches see asked for by many requesters (hot) and
which the switch pool holds (pooled); agents do not.  It tells every agent with ``POST
/v1/hints`` (``hostagent.api``), whose body is the document this module defines, and the
agent picks each chunk's path from it (``hostagent.hints``):

* a chunk not named takes the **range** path, the cheap one (``GetPath.RANGE``);
* ``single``: a hot chunk, asked for by range GETs like any chunk not named (switches
  coalesce range GETs per chunk; the name is from when they coalesced single GETs only);
* ``servable``: one GET per fragment with reply room, which a switch can also answer from
  its pool (a pooled chunk).

Document: ``{"ttl_s": seconds, "merge": bool, "chunks": [{"key": "0x...", "path": "single"
| "servable", "nbytes": n}, ...]}``.  It replaces everything told before (an empty list
clears every hint) and is trusted for ``ttl_s`` seconds, so a controller that stops sending
cannot leave agents on the expensive path.  ``merge`` says whether the switches merge
duplicate GETs (multicast and pool modes): then a holder books the requesters it refuses
for one instant, so they meet again in a switch.  ``nbytes`` (0: unknown) is the chunk's
serialized length, with which a requester asks for every fragment of a pooled chunk at
once instead of fragment 0 first.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

MAX_HINTS: Final = 1 << 16
"""Most chunks one document may name (the hot and pooled sets are small)."""
MAX_TTL_S: Final = 3600.0
"""Longest time a document is trusted without a new one."""


class GetPath(enum.StrEnum):
    """How a requester asks a holder for a chunk's fragments."""

    RANGE = "range"
    """Range GETs, answered by the holder at once: the cheap path, the default."""
    SINGLE = "single"
    """A hot chunk: asked for by range GETs, as the range path (switches coalesce them per chunk)."""
    SERVABLE = "servable"
    """One GET per fragment with reply room: a switch can also answer them from its pool (pooled chunks)."""


@dataclass(frozen=True, slots=True)
class Hint:
    """What the fabric says of one chunk: the path worth taking and, when known, its length."""

    path: GetPath
    nbytes: int = 0


class HintError(ValueError):
    """A hints document that cannot be applied (one line, names the first bad item)."""


@dataclass(frozen=True, slots=True)
class Hints:
    """One document: the chunks named, how long to trust them, whether the switches merge."""

    chunks: Mapping[int, Hint]
    ttl_s: float
    merge: bool


def document(hints: Hints) -> dict[str, Any]:
    """The JSON document for ``hints`` (``parse`` reads it back)."""
    return {"ttl_s": hints.ttl_s, "merge": hints.merge,
            "chunks": [{"key": f"{k:#018x}", "path": str(h.path), "nbytes": h.nbytes}
                       for k, h in sorted(hints.chunks.items())]}


def parse(doc: Mapping[str, Any]) -> Hints:
    """The ``Hints`` of a document, or ``HintError`` naming the first bad item."""
    ttl = doc.get("ttl_s")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_S:
        raise HintError(f"ttl_s must be a number of seconds in (0, {MAX_TTL_S:g}], got {ttl!r}")
    merge = doc.get("merge", False)
    if not isinstance(merge, bool):
        raise HintError(f"merge must be true or false, got {merge!r}")
    items = doc.get("chunks")
    if not isinstance(items, list):
        raise HintError('chunks must be a list of {"key", "path", "nbytes"} objects')
    if len(items) > MAX_HINTS:
        raise HintError(f"{len(items)} chunks named, at most {MAX_HINTS}")
    out: dict[int, Hint] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise HintError(f"chunks[{i}] must be an object")
        key, path, nbytes = item.get("key"), item.get("path"), item.get("nbytes", 0)
        try:
            k = int(key, 16) if isinstance(key, str) and 2 < len(key) <= 18 and key[:2] in ("0x", "0X") else -1
        except ValueError:
            k = -1
        if not 0 <= k < 1 << 64:
            raise HintError(f"chunks[{i}].key must be a 64-bit key as 0x-prefixed hex, got {str(key)[:40]!r}")
        if path not in (GetPath.SINGLE, GetPath.SERVABLE):
            raise HintError(f"chunks[{i}].path must be single or servable, got {path!r}")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise HintError(f"chunks[{i}].nbytes must be a non-negative integer, got {nbytes!r}")
        out[k] = Hint(GetPath(path), nbytes)
    return Hints(out, float(ttl), merge)
