"""switchmodel.targets: BMv2's command line carries only the options its build lists in --help."""

from __future__ import annotations

from pathlib import Path

from switchmodel.targets import bmv2_argv, bmv2_options

# Abridged `simple_switch_grpc --help` of a P4Runtime-only build (PI, --without-thrift).
HELP_NO_THRIFT = """Usage: SWITCH_NAME [options] <path to JSON config file>
Options:
  -h [ --help ]               Display this help message
  -i [ --interface ] arg      <port-num>@<interface-name>
  --no-p4                     Enable the switch to start without an inout
  --device-id arg             Device ID, used to identify the device in IPC
  --notifications-addr arg    Specify the nanomsg address to use for notifications
  --log-console               Enable logging on stdout
  -L [ --log-level ] arg      Set log level
"""


def _fake_switch(tmp_path: Path, help_text: str) -> str:
    script = tmp_path / "simple_switch_grpc"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}EOF\n")
    script.chmod(0o755)
    return str(script)


def test_a_thrift_less_build_gets_no_thrift_port(tmp_path: Path) -> None:
    options = bmv2_options(_fake_switch(tmp_path, HELP_NO_THRIFT))
    assert "--thrift-port" not in options and {"--notifications-addr", "--no-p4", "--device-id"} <= options
    argv = bmv2_argv(["veth1", "veth3"], 50051, options, device_id=2, thrift_port=9090)
    assert "--thrift-port" not in argv
    assert argv[:3] == ["simple_switch_grpc", "--device-id", "2"]
    assert argv[argv.index("--notifications-addr") + 1] == "ipc:///tmp/kvpool-bmv2-50051-notifications.ipc"
    assert argv[argv.index("--") + 1:] == ["--grpc-server-addr", "127.0.0.1:50051"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-i"] == ["1@veth1", "2@veth3"]


def test_a_build_with_thrift_gets_its_own_thrift_port(tmp_path: Path) -> None:
    help_text = HELP_NO_THRIFT + "  --thrift-port arg           TCP port on which to run the Thrift runtime server\n"
    options = bmv2_options(_fake_switch(tmp_path, help_text))
    argv = bmv2_argv(["veth1"], 50052, options, thrift_port=9091, trace=True)
    assert argv[argv.index("--thrift-port") + 1] == "9091"
    assert argv[argv.index("-L") + 1] == "trace" and argv.index("--log-console") < argv.index("--")
