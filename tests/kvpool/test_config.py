"""kvpool.config: one strict TOML loader for both daemons (the agent's [agent], the controller's [controller]).

An unknown key or a value of the wrong type is one line naming the key, and both CLIs exit
with status 2 on it; flags override the file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli import ControllerConfig, build_parser, config_from_args
from kvpool.config import ConfigError, load, load_table
from tests.paths import REPO


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kvpool.toml"
    path.write_text(text)
    return path


def test_controller_file_then_flags(tmp_path: Path) -> None:
    conf = _file(tmp_path, '[controller]\ntopology = "bmv2_topologies/star.json"\nswitch = ["s1=127.0.0.1:50051@1"]\n'
                           'epoch = 1\nthreshold = 7\nmode = "multicast"\n')
    cfg = config_from_args(build_parser().parse_args(["--config", str(conf), "--epoch", "0.25"]))
    assert cfg.topology == Path("bmv2_topologies/star.json") and cfg.switches() == [("s1", "127.0.0.1:50051", 1)]
    assert (cfg.epoch, cfg.threshold, cfg.mode, cfg.pending_timeout_us) == (0.25, 7, "multicast", None)
    assert load(conf, "controller", ControllerConfig).epoch == 1.0  # an integer where a float goes


def test_one_file_holds_both_daemons(tmp_path: Path) -> None:
    from hostagent.daemon import load_config

    conf = _file(tmp_path, "[agent]\napi_port = 9001\n[controller]\nepoch = 2.0\n")
    with pytest.raises(ConfigError, match=r"settings go in the \[agent\] table"):
        load_config(conf)  # the agent reads only its own table ...
    conf.write_text("[agent]\napi_port = 9001\n")
    assert load_config(conf).api_port == 9001
    conf.write_text("[controller]\nepoch = 2.0\n")
    assert load_table(conf, "controller", ControllerConfig) == {"epoch": 2.0}


@pytest.mark.parametrize(("text", "match"), [
    ("[controller]\nepochs = 1\n", "unknown setting 'epochs' in \\[controller\\]"),
    ("[controller]\nepoch = \"fast\"\n", "epoch must be float, got 'fast'"),
    ("[controller]\nthreshold = true\n", "threshold must be int"),
    ("[controller]\nswitch = \"s1=h:1\"\n", "switch must be list\\[str\\]"),
    ("[controller]\nswitch = [1]\n", "switch must be list\\[str\\]"),
    ("[controller]\ntopology = 3\n", "topology must be path"),
    ("epoch = 1\n", "settings go in the \\[controller\\] table"),
    ("[controller\n", "not valid TOML"),
])
def test_bad_controller_files(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(_file(tmp_path, text), "controller", ControllerConfig)


@pytest.mark.parametrize(("text", "args", "match"), [
    ("", ["--switch", "s1=127.0.0.1:1"], "--topology is required"),
    ("", ["--topology", "t.json"], "--switch is required"),
    ("", ["--topology", "t.json", "--switch", "s1"], "expected NAME=HOST:PORT"),
    ('[controller]\nmode = "turbo"\n', ["--topology", "t.json", "--switch", "s1=h:1"], "mode must be one of"),
    ("[controller]\nepoch = 0\n", ["--topology", "t.json", "--switch", "s1=h:1"], "epoch must be a positive"),
    ('[controller]\nholder_api = "ftp://h0"\n', ["--topology", "t.json", "--switch", "s1=h:1"],
     "expected http://HOST:PORT or unix:/PATH"),
    ("", ["--topology", "t.json", "--switch", "s1=h:1", "--api", "localhost"], "api must be HOST:PORT"),
])
def test_bad_controller_values(tmp_path: Path, text: str, args: list[str], match: str) -> None:
    argv = ["--config", str(_file(tmp_path, text)), *args] if text else args
    with pytest.raises(ConfigError, match=match):
        config_from_args(build_parser().parse_args(argv))


@pytest.mark.parametrize(("module", "text", "key"), [
    ("controller.cli", "[controller]\nbogus = 1\n", "bogus"),
    ("controller.cli", "[controller]\nheartbeat_timeout = [1]\n", "heartbeat_timeout"),
    ("hostagent.cli", "[agent]\nbogus = 1\n", "bogus"),
    ("hostagent.cli", "[agent]\nudp_port = \"x\"\n", "udp_port"),
])
def test_both_daemons_exit_2_with_one_line_naming_the_key(tmp_path: Path, module: str, text: str, key: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--config", str(_file(tmp_path, text))],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and key in line and "kvpool.toml" in line, line
