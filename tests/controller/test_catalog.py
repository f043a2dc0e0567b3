"""The chunk catalog on its own: JSON round trip and errors that name the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.catalog import Catalog, ChunkInfo
from controller.settings import ControllerError
from kvpool import wire

KEY = 0x1234_5678_9ABC_DEF0


def test_catalog_round_trip_and_errors(tmp_path: Path) -> None:
    cat = Catalog([ChunkInfo(KEY, None, 0, 5000), ChunkInfo(KEY + 1, KEY, 1, 1408)])
    path = tmp_path / "chunks.json"
    cat.save(path)
    again = Catalog.load(path)
    assert again.get(KEY + 1) == ChunkInfo(KEY + 1, KEY, 1, 1408)
    path.write_text('[{"key": "zz"}]')
    with pytest.raises(ControllerError, match="entry 0"):
        Catalog.load(path)
    with pytest.raises(ControllerError, match="no such catalog"):
        Catalog.load(tmp_path / "none.json")


def test_keys_are_hex_and_lengths_checked() -> None:
    cat = Catalog()
    cat.add(ChunkInfo(KEY, None, 0, 3 * wire.FRAG_PAYLOAD + 1))
    assert cat.get(KEY) is not None and cat.get(KEY).frag_count == 4  # type: ignore[union-attr]
    assert cat.to_json() == [{"key": f"{KEY:#x}", "parent": None, "position": 0, "nbytes": 3 * wire.FRAG_PAYLOAD + 1}]
    with pytest.raises(ValueError):
        cat.add(ChunkInfo(KEY + 1, None, 0, 0))
    assert len(cat) == 1 and cat.get(KEY + 1) is None
