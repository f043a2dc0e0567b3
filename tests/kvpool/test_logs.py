"""kvpool.logs: one line format for every daemon, in text and JSON, and the daemons' flags that pick it."""

from __future__ import annotations

import io
import json
import logging
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostagent.daemon import spawn_agent
from kvpool import logs

TEXT_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (\w+) +(\S+): (.*)$")


Capture = tuple[logging.Logger, io.StringIO, list[logging.Handler]]


@pytest.fixture
def capture() -> Iterator[Capture]:
    stream = io.StringIO()
    log = logging.getLogger("kvpool.testcomponent")
    # Once Mininet is imported in this process, new loggers are its MininetLogger, created at
    # its own level (25): let this one take the level `configure` sets on "kvpool".
    log.setLevel(logging.NOTSET)
    handlers: list[logging.Handler] = []
    yield log, stream, handlers
    for h in handlers:
        logging.getLogger("kvpool").removeHandler(h)


def _configure(fmt: str, stream: io.StringIO, handlers: list[logging.Handler], level: str = "info") -> None:
    handlers.append(logs.configure(fmt, level, logger="kvpool", stream=stream))


def test_text_line_has_timestamp_level_component_message_and_fields(capture: Capture) -> None:
    log, stream, handlers = capture
    _configure("text", stream, handlers)
    log.info("fetched %d chunks", 3, extra=logs.kv(holder="10.0.0.1:7470", bytes=4096, why="no room left", ok=True,
                                                 udp=["10.0.0.2", 7470], tiers={"dram": 1}))
    line = stream.getvalue().rstrip("\n")
    m = TEXT_LINE.match(line)
    assert m is not None, line
    assert m.group(2) == "INFO" and m.group(3) == "testcomponent"
    assert m.group(4).startswith("fetched 3 chunks ")
    fields = shlex.split(m.group(4))[3:]  # a quoted value splits back whole
    assert fields == ["holder=10.0.0.1:7470", "bytes=4096", "why=no room left", "ok=true", "udp=10.0.0.2,7470",
                      'tiers={"dram":1}']


def test_json_line_is_one_object_with_the_same_parts(capture: Capture) -> None:
    log, stream, handlers = capture
    _configure("json", stream, handlers)
    log.warning("switch %s down", "s1", extra=logs.kv(switch="s1", reconnects=2, msg="clash"))
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert (first["level"], first["component"], first["msg"]) == ("warning", "testcomponent", "switch s1 down")
    assert first["switch"] == "s1" and first["reconnects"] == 2 and first["field_msg"] == "clash"
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]


def test_level_filters_and_components_outside_kvpool_keep_their_names(capture: Capture) -> None:
    log, stream, handlers = capture
    _configure("text", stream, handlers, level="warning")
    log.info("hidden")
    log.warning("shown")
    assert "hidden" not in stream.getvalue() and "shown" in stream.getvalue()
    assert logs.component("kvpool.controller.api") == "controller.api" and logs.component("grpc") == "grpc"
    with pytest.raises(ValueError, match="text, json"):
        logs.formatter("xml")


def test_timestamps_are_utc_milliseconds() -> None:
    assert logs.timestamp(0.25) == "1970-01-01T00:00:00.250Z"
    assert logs.timestamp(86400 + 59.999) == "1970-01-02T00:00:59.999Z"


def test_agent_logs_json_lines_with_log_format_json(tmp_path: Path) -> None:
    proc = spawn_agent(tmp_path, "--log-format", "json", "--log-level", "INFO")
    try:
        pass
    finally:
        assert proc.stop() == 0
    lines = [json.loads(x) for x in proc.log().splitlines() if x.startswith("{")]
    ready = next(x for x in lines if x["msg"] == "ready")
    assert ready["component"] == "agent" and ready["level"] == "info" and ready["pid"] == proc.pid
    assert ready["api_url"] == proc.api_url


@pytest.mark.parametrize("module", ["controller.cli", "switchmodel.cli"])
def test_controller_and_switch_take_the_same_flags(module: str) -> None:
    import importlib

    parser = importlib.import_module(module).build_parser()
    args = parser.parse_args(["--log-format", "json", "--log-level", "debug"])
    assert args.log_format == "json" and args.log_level == "debug"
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format", "xml"])
