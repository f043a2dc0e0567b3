"""The chunk catalog: key -> parent, position in its prefix, serialized length.

The catalog is what lets the controller write exact pool entries: a switch fills only
writer DATA whose generation, fragment count and length equal the entry's. On disk it is a
JSON list with keys as hex strings (JSON numbers lose precision past 2**53).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.settings import ControllerError
from kvpool import wire


@dataclass
class ChunkActivity:
    """What the controller saw of one chunk: fetches observed, switch hits, last data-plane estimate."""

    fetches: int = 0
    hits: int = 0
    reported: int = 0


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What the controller must know of a chunk to admit it."""

    key: int
    parent: int | None
    position: int
    nbytes: int

    @property
    def frag_count(self) -> int:
        """Fragments (= switch slots) the chunk occupies."""
        return wire.fragment_count(self.nbytes)


class Catalog:
    """Chunk key -> ``ChunkInfo``: the chunks holders can serve (a JSON list on disk)."""

    def __init__(self, chunks: Iterable[ChunkInfo] = ()) -> None:
        self._chunks = {c.key: c for c in chunks}

    def __len__(self) -> int:
        return len(self._chunks)

    def get(self, key: int) -> ChunkInfo | None:
        """The chunk's info, or None when unknown."""
        return self._chunks.get(key)

    def add(self, info: ChunkInfo) -> None:
        """Add or replace one chunk."""
        wire.fragment_count(info.nbytes)  # raises for a length no DATA packet can describe
        self._chunks[info.key] = info

    def to_json(self) -> list[dict[str, Any]]:
        """JSON form: keys as hex strings (JSON numbers lose precision past 2**53)."""
        return [{"key": f"{c.key:#x}", "parent": None if c.parent is None else f"{c.parent:#x}",
                 "position": c.position, "nbytes": c.nbytes} for c in self._chunks.values()]

    def save(self, path: Path) -> None:
        """Write the catalog as JSON."""
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Catalog:
        """Read a catalog written by ``save``; errors name the entry."""
        try:
            items = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ControllerError(f"{path}: no such catalog file") from None
        except json.JSONDecodeError as exc:
            raise ControllerError(f"{path}: not valid JSON ({exc})") from None
        cat = cls()
        for i, item in enumerate(items):
            try:
                parent = item.get("parent")
                cat.add(ChunkInfo(int(item["key"], 16), None if parent is None else int(parent, 16),
                                  int(item["position"]), int(item["nbytes"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ControllerError(f"{path}: entry {i} is not a chunk ({exc})") from None
        return cat
