"""scripts/policy_loo.py: its leader-race trackers replay exactly what the engine does."""

from __future__ import annotations

import random
import runpy

from controller.sim.config import MODELS, ClusterConfig
from tests.paths import SCRIPTS

SCRIPT = SCRIPTS / "policy_loo.py"


def test_the_default_candidate_is_the_engine_hit_for_hit() -> None:
    """``run_cell`` raises SystemExit when the tracker of the engine's defaults and a real engine disagree."""
    mod = runpy.run_path(str(SCRIPT))
    rng = random.Random(3)
    # Prefix chains of a few hundred prompts with skewed popularity, many more chunks than the pool holds,
    # so the experts disagree, the leader changes hands and hand-overs keep and refill chunks.
    keys: list[int] = []
    par: list[int] = []
    pos: list[int] = []
    for _ in range(6000):
        prompt = int(300 * rng.random() ** 3)
        depth = 1 + prompt % 5
        for d in range(depth):
            keys.append(prompt * 16 + d + 1)
            par.append(prompt * 16 + d if d else -1)
            pos.append(d)
    cfg = ClusterConfig(nodes=64, model=MODELS["qwen2.5-0.5b"], switch_mib=256.0)
    out = mod["run_cell"](keys, par, pos, cfg, True)
    default = mod["default_name"]()
    assert 0.0 < out[default] < 1.0
    assert len(out) == len(mod["candidates"]())
    # the race's decision period and its test are candidate dimensions: the engine's 128 and the
    # earlier 512, the engine's paired test and the Poisson test before it
    assert default.endswith("every=128|paired")
    assert default.replace("every=128", "every=512") in out
    assert default.replace("|paired", "|poisson") == mod["PREVIOUS_DEFAULT"] and mod["PREVIOUS_DEFAULT"] in out
