"""One log format for every kvpool daemon: timestamp, level, component, message, ``key=value`` fields.

``kvpool-agent``, ``kvpool-controller`` and ``kvpool-switch`` all call ``configure`` with their
``--log-format`` (``text`` for people, ``json`` for machines: one object per line) and
``--log-level``. A text line reads::

    2026-12-07T02:40:01.123Z INFO    agent: ready api=http://127.0.0.1:7471 udp=127.0.0.1:7470

and the same record in JSON::

    {"ts": "2026-12-07T02:40:01.123Z", "level": "info", "component": "agent", "msg": "ready",
     "api": "http://127.0.0.1:7471", "udp": "127.0.0.1:7470"}

The component is the logger's name without the ``kvpool.`` prefix (``kvpool.controller.api``
-> ``controller.api``); other libraries' loggers keep their names. Fields come from
``extra=kv(name=value, ...)``; in text a list of plain values is written comma-joined, any
other non-string as compact JSON, and a value with spaces, quotes or ``=`` is JSON-quoted so
a line always splits back into its fields. Timestamps are UTC, to the millisecond.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

FORMATS: Final = ("text", "json")
LEVELS: Final = ("debug", "info", "warning", "error")
_FIELDS: Final = "kvpool_fields"


def kv(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call that carries ``key=value`` fields: ``log.info("ready", extra=kv(pid=1))``."""
    return {_FIELDS: fields}


def component(name: str) -> str:
    """The component a logger name stands for (``kvpool.agent`` -> ``agent``; ``kvpool`` -> ``kvpool``)."""
    return name.removeprefix("kvpool.") if name.startswith("kvpool.") else name


def timestamp(created: float) -> str:
    """ISO 8601, UTC, milliseconds: ``2026-12-07T02:40:01.123Z``."""
    seconds, ms = divmod(round(created * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list | tuple) and all(isinstance(v, str | int | float) for v in value):
        text = ",".join(map(str, value))  # udp=127.0.0.1,7470
    else:
        text = json.dumps(value, default=str, separators=(",", ":"))
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``TIMESTAMP LEVEL component: message key=value ...``, a traceback on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        """One record as a line (plus its traceback, if any)."""
        fields = getattr(record, _FIELDS, {})
        line = f"{timestamp(record.created)} {record.levelname:<7} {component(record.name)}: {record.getMessage()}"
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``component``, ``msg``, the fields, ``exc`` if any."""

    def format(self, record: logging.LogRecord) -> str:
        """One record as a JSON line."""
        doc: dict[str, Any] = {"ts": timestamp(record.created), "level": record.levelname.lower(),
                               "component": component(record.name), "msg": record.getMessage()}
        for key, value in getattr(record, _FIELDS, {}).items():
            doc[key if key not in doc else f"field_{key}"] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (``ValueError`` for another name)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(fmt: str = "text", level: str = "info", *, logger: str = "", path: Path | None = None,
              stream: TextIO | None = None) -> logging.Handler:
    """Log ``logger``'s records (default: every logger) at ``level`` and up in ``fmt`` to ``path`` or stderr.

    Returns the handler, so a daemon run in-process (tests) can remove it when it stops.
    """
    handler: logging.Handler = (logging.FileHandler(path) if path is not None
                                else logging.StreamHandler(stream or sys.stderr))
    handler.setFormatter(formatter(fmt))
    target = logging.getLogger(logger or None)
    target.addHandler(handler)
    target.setLevel(level.upper())
    if logging.getLogger("httpx").level == logging.NOTSET:
        # httpx logs every request at INFO: a controller's hint pushes would bury its own lines.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, target.getEffectiveLevel()))
    return handler
