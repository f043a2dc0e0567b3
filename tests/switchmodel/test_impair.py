"""Link impairment of the model switch: spec parsing, rates, seeded determinism, run-time control."""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from switchmodel.cli import main as switch_main
from switchmodel.impair import Impairer, ImpairFile, Impairment, ImpairSpec, flip_bit, parse_specs
from switchmodel.ports import PortIO, PortSpec
from switchmodel.vethlab import VethLab, can_build

N = 20_000
"""Frames per rate test: a 5-sigma band is a few percent of the expected count."""


def _frames(n: int, size: int = 200) -> list[bytes]:
    rng = random.Random(3)
    return [i.to_bytes(4, "big") + rng.randbytes(size - 4) for i in range(n)]


def _within(observed: int, n: int, p: float) -> bool:
    """``observed`` is within 5 standard deviations of a Binomial(n, p) mean."""
    sigma = math.sqrt(n * p * (1 - p))
    return abs(observed - n * p) <= 5 * sigma


def _run(imp: Impairer, frames: list[bytes], port: int = 1, direction: str = "in") -> list[bytes]:
    """Every frame through one channel, time frozen, then everything held released."""
    out: list[bytes] = []
    for f in frames:
        out += imp.ingress(port, f, 0.0) if direction == "in" else imp.egress(port, f, 0.0)
    out += [frame for _, _, frame in imp.due(math.inf)]
    return out


@pytest.mark.parametrize(("text", "expected"), [
    ("2:in:loss=0.1,seed=7", ImpairSpec(2, "in", Impairment(loss=0.1, seed=7))),
    ("*:both:corrupt=0.01", ImpairSpec(None, "both", Impairment(corrupt=0.01))),
    (" 510 : out : dup=0.05, reorder=0.25, delay_ms=2 ", ImpairSpec(510, "out", Impairment(dup=0.05, reorder=0.25,
                                                                                         delay_ms=2))),
    ("3:in:", ImpairSpec(3, "in", Impairment())),
])
def test_spec_parse_and_round_trip(text: str, expected: ImpairSpec) -> None:
    spec = ImpairSpec.parse(text)
    assert spec == expected
    assert ImpairSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("2:in", "expected PORT:DIR"),
    ("511:in:loss=0.1", "port must be 0..510"),
    ("x:in:loss=0.1", "port must be"),
    ("1:up:loss=0.1", "direction must be one of in, out, both"),
    ("1:in:lose=0.1", "not key=value with a key from"),
    ("1:in:loss", "not key=value"),
    ("1:in:loss=much", "loss must be float"),
    ("1:in:seed=1.5", "seed must be int"),
    ("1:in:loss=1.5", "must be a probability"),
    ("1:in:reorder=0.1,delay_ms=0", "delay_ms=0.0: must be in"),
    ("1:in:seed=-1", "must be >= 0"),
])
def test_spec_parse_errors_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        ImpairSpec.parse(text)
    assert "\n" not in str(err.value)


def test_parse_specs_skips_comments_and_refuses_a_channel_twice() -> None:
    assert parse_specs(["# none", "", "1:in:loss=0.5  # half"]) == [ImpairSpec(1, "in", Impairment(loss=0.5))]
    assert len(parse_specs(["1:in:loss=0.1", "1:out:loss=0.1", "*:both:dup=0.1"])) == 3
    with pytest.raises(ValueError, match="port 1 direction in already has one"):
        parse_specs(["1:both:loss=0.1", "1:in:dup=0.2"])


@pytest.mark.parametrize("name", ["loss", "dup", "corrupt", "reorder"])
@pytest.mark.parametrize("p", [0.01, 0.1, 0.25])
def test_rates_are_within_binomial_bounds(name: str, p: float) -> None:
    imp = Impairer([ImpairSpec(1, "in", Impairment(**{name: p}, seed=11))])  # type: ignore[arg-type]
    out = _run(imp, _frames(N))
    st = imp.stats()["1:in"]
    assert st["frames"] == N
    counter = {"loss": "lost", "dup": "duplicated", "corrupt": "corrupted", "reorder": "reordered"}[name]
    assert _within(st[counter], N, p), st
    # Nothing else happens, and the output accounts for every frame.
    assert sum(st.values()) == N + st[counter]
    assert len(out) == N - st["lost"] + st["duplicated"]


def test_corruption_flips_exactly_one_bit_anywhere_in_the_frame() -> None:
    frames = _frames(N, size=1500)
    imp = Impairer([ImpairSpec(1, "in", Impairment(corrupt=0.5, seed=2))])
    out = _run(imp, frames)
    assert len(out) == N
    flipped = [(i, a, b) for i, (a, b) in enumerate(zip(frames, out, strict=True)) if a != b]
    assert len(flipped) == imp.stats()["1:in"]["corrupted"]
    positions = []
    for _, a, b in flipped:
        diff = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
        assert diff.bit_count() == 1
        positions.append(len(a) * 8 - diff.bit_length())
    # Uniform over the frame: each tenth of it gets about a tenth of the flips.
    tenths = [0] * 10
    for bit in positions:
        tenths[bit * 10 // (1500 * 8)] += 1
    assert all(_within(t, len(positions), 0.1) for t in tenths), tenths


def test_flip_bit_numbers_bits_msb_first() -> None:
    assert flip_bit(b"\x00\x00", 0) == b"\x80\x00"
    assert flip_bit(b"\x00\x00", 15) == b"\x00\x01"
    assert flip_bit(flip_bit(b"abc", 9), 9) == b"abc"


def test_reordered_frames_are_held_and_overtaken() -> None:
    imp = Impairer([ImpairSpec(4, "out", Impairment(reorder=0.3, delay_ms=5, seed=1))])
    frames = _frames(1000)
    now = 100.0
    immediate = []
    for f in frames:
        immediate += imp.egress(4, f, now)
    held = imp.stats()["4:out"]["reordered"]
    assert len(immediate) == 1000 - held and held > 0
    assert imp.next_due() == pytest.approx(now + 0.005)
    assert imp.due(now + 0.004) == []  # not before their time
    late = imp.due(now + 0.005)
    assert [(d, p) for d, p, _ in late] == [("out", 4)] * held
    # Held frames come out in their own order, after frames that were sent later.
    late_frames = [f for _, _, f in late]
    assert sorted(late_frames, key=frames.index) == late_frames
    assert immediate.index(frames[-1]) == len(immediate) - 1 or frames[-1] in late_frames
    assert imp.next_due() is None and not imp.due(math.inf)


def test_same_seed_same_fate_other_seed_other_fate() -> None:
    spec = "*:both:loss=0.1,dup=0.05,reorder=0.25,corrupt=0.01,seed={}"
    frames = _frames(5000)
    runs = [_run(Impairer(parse_specs([spec.format(s)])), frames, port=3, direction=d)
            for s, d in ((5, "in"), (5, "in"), (6, "in"), (5, "out"))]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert runs[0] != runs[3]  # each direction has its own generator


def test_port_spec_overrides_the_catch_all_and_unimpaired_ports_pass() -> None:
    imp = Impairer(parse_specs(["*:in:loss=1", "2:in:dup=1"]))
    assert imp.ingress(1, b"a", 0) == []
    assert imp.ingress(2, b"b", 0) == [b"b", b"b"]
    assert imp.egress(1, b"c", 0) == [b"c"]
    assert not Impairer(parse_specs(["1:in:seed=3"])).active  # nothing to do: no channel at all


def test_configure_restarts_the_generators_and_keeps_the_counts() -> None:
    imp = Impairer(parse_specs(["1:in:loss=0.5,seed=9"]))
    first = _run(imp, _frames(100))
    imp.configure(parse_specs(["1:in:loss=0.5,seed=9"]))
    assert _run(imp, _frames(100)) == first
    assert imp.stats()["1:in"]["frames"] == 200
    imp.configure([])
    assert not imp.active and _run(imp, _frames(10)) == _frames(10)


def test_impair_file_replaces_the_command_line_while_it_exists(tmp_path: Path) -> None:
    path = tmp_path / "impair"
    fallback = parse_specs(["1:in:loss=0.1"])
    watch = ImpairFile(path, fallback)
    assert watch.poll(0.0) is None  # no file: the command line's specs stay in force
    path.write_text("2:out:dup=0.5\n")
    assert watch.poll(0.05) is None  # checked at most every 0.1 s
    assert watch.poll(1.0) == parse_specs(["2:out:dup=0.5"])
    assert watch.poll(2.0) is None  # unchanged
    path.write_text("")
    assert watch.poll(3.0) == []  # empty file: no impairment
    path.write_text("2:sideways:dup=0.5\n")
    assert watch.poll(4.0) is None  # a bad file is ignored (logged), what is in force stays
    path.unlink()
    assert watch.poll(5.0) == fallback


def test_switch_cli_refuses_a_bad_impairment(capsys: pytest.CaptureFixture[str]) -> None:
    assert switch_main(["--impair", "1:in:loss=2"]) == 2
    assert "must be a probability" in capsys.readouterr().err


class _Swap:
    """Sends a frame from port 1 to port 2 and back."""

    def process(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return [(3 - ingress_port, frame)] if ingress_port in (1, 2) else []


@pytest.mark.root
@pytest.mark.skipif(can_build() is not None, reason=str(can_build()))
def test_port_io_impairs_real_interfaces_and_stops_when_the_file_empties(tmp_path: Path) -> None:
    control = tmp_path / "impair"
    control.write_text("1:in:dup=1\n2:out:reorder=1,delay_ms=50,seed=1\n")
    with VethLab(2) as lab:
        io = PortIO([PortSpec(1, lab.switch_ifs[0]), PortSpec(2, lab.switch_ifs[1])], _Swap(),
                    impair_file=ImpairFile(control))
        with io:
            io.start()

            def frame(n: int) -> bytes:
                return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                             / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / Raw(bytes([n]) * 40))

            def collect(want: int, within: float) -> list[bytes]:
                got: list[bytes] = []
                deadline = time.monotonic() + within
                while len(got) < want and time.monotonic() < deadline:
                    f = lab.recv(1)
                    if f is None:
                        time.sleep(0.002)
                    else:
                        got.append(f)
                return got

            time.sleep(0.3)  # the loop reads the file within 0.1 s
            sent = time.monotonic()
            lab.send(0, frame(1))
            got = collect(2, 5.0)
            assert got == [frame(1), frame(1)]  # duplicated on the way in
            assert time.monotonic() - sent >= 0.05  # and both copies held on the way out
            control.write_text("")
            time.sleep(0.3)
            lab.send(0, frame(2))
            assert collect(1, 5.0) == [frame(2)]
            assert collect(1, 0.2) == []
            stats = io.impairer.stats() if io.impairer is not None else {}
            assert stats["1:in"]["duplicated"] == 1 and stats["2:out"]["reordered"] == 2
            os.unlink(control)
