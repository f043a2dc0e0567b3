"""The shared secret that every mutating call of kvpool's local APIs must carry.

One token per operator: a random secret in a file only its owner can read (mode 0600, in
a directory of mode 0700). The first daemon that starts (agent or controller) creates it;
``kvpool-ctl``, the agents' registration with the controller, ``AgentClient``, the
controller's fill requests and the experiments read it. A request presents it as
``Authorization: Bearer <token>``; servers compare in constant time
(``kvpool.http_server.ApiServer``). See docs/guide/operations.md, "Threat model and authentication".

Where the file is: ``--token-file`` where a program has it, else ``$KVPOOL_TOKEN_FILE``,
else ``$XDG_RUNTIME_DIR/kvpool/token`` when that directory exists, else
``~/.config/kvpool/token``.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

ENV = "KVPOOL_TOKEN_FILE"
"""Environment variable naming the token file (what ``--token-file`` overrides)."""
NODE_CREDENTIAL_HEADER = "X-Kvpool-Node-Credential"
"""Carries the per-node credential the controller's directory hands a node when it registers:
every later call for that node must present it (``controller.api``, ``hostagent.registration``)."""


class TokenError(ValueError):
    """The token file cannot be used (unreadable, malformed, or readable by others); one line."""


@dataclass(frozen=True)
class Token:
    """The secret and the file it came from (named in errors, never the secret itself)."""

    value: str
    path: Path

    def matches(self, presented: str) -> bool:
        """True when ``presented`` is this token (constant time: no timing hint of how much matched)."""
        return hmac.compare_digest(self.value.encode(), presented.encode())

    def __repr__(self) -> str:
        return f"Token(path={str(self.path)!r})"  # never print the secret


def default_path() -> Path:
    """Where the token lives when no ``--token-file`` says otherwise (see the module docstring)."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "kvpool" / "token"
    return Path.home() / ".config" / "kvpool" / "token"


def _parse(path: Path, text: str) -> Token:
    value = text.strip()
    if len(value) < 32 or not value.isascii() or not value.isalnum():
        raise TokenError(f"token file {path} does not hold a token (32 or more letters and digits); "
                         "delete it and a daemon makes a new one")
    return Token(value, path)


def read(path: Path | None = None) -> Token | None:
    """The token from ``path`` (default: ``default_path()``); None when the file does not exist."""
    path = path or default_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(f"token file {path} cannot be read: {exc}") from None
    return _parse(path, text)


def secret(path: Path | None = None) -> str | None:
    """What a client sends: the token in ``path`` (default: ``default_path()``), None when there is none yet."""
    token = read(path)
    return None if token is None else token.value


def load_or_create(path: Path | None = None) -> Token:
    """The token from ``path``, made first (random, mode 0600) when it does not exist: what daemons call.

    Refuses a file that group or others may read or write: the secret would not be one.
    """
    path = path or default_path()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return _create(path)
    except OSError as exc:
        raise TokenError(f"token file {path} cannot be read: {exc}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise TokenError(f"token file {path} has mode {stat.S_IMODE(mode):04o}: others may read it; "
                         f"chmod 600 {path}")
    token = read(path)
    if token is None:  # removed between stat and read
        return _create(path)
    return token


def _create(path: Path) -> Token:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Written under another name, then linked into place: a daemon starting at the same
        # moment either finds no file or a complete one, never half a secret.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another daemon won the race: use its token
                os.link(tmp, path)
        finally:
            tmp.unlink()
    except OSError as exc:
        raise TokenError(f"cannot create token file {path}: {exc}") from None
    token = read(path)
    if token is None:
        raise TokenError(f"token file {path} vanished right after it was created")
    return token
