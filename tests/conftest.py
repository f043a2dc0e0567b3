"""Session-wide test setup: one kvpool token file for every daemon and client the tests start.

Daemons make the operator's token file on first start and clients read it (``kvpool.auth``);
pointing ``KVPOOL_TOKEN_FILE`` at a temporary file keeps the tests away from the real one in
the home directory, and child processes (agents started by the tests) inherit it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool import auth


@pytest.fixture(autouse=True, scope="session")
def _token_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(auth.ENV, str(tmp_path_factory.mktemp("kvpool-auth") / "token"))
        yield
