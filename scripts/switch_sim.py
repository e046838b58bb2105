"""Simulate the cost switch (engine.control.cost.CostSwitch, the real class) on fixed prices
and i.i.d. acceptance, to see what its exploration costs (docs/benchmarks.md, "Pricing a
drafted round from its own calls and forwards").

Each round the switch plans a depth; a drafted round of depth D accepts each next depth with
probability a (the path stops at the first rejection) and costs C_D plain rounds, a plain round
costs 1 and commits one token. Prints tokens per plain-round time for each acceptance level and
policy, next to the best fixed depth's E_D / C_D. Policies: the switch as shipped ("prior"),
plain rounds fading 4x slower ("slow"), and fading towards the run's own mean acceptance instead
of the prior ("run mean")::

    .venv/bin/python scripts/switch_sim.py --rounds 48 --seeds 4
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.control.cost import (  # noqa: E402
    CostProfile,
    CostSwitch,
    chain_shape,
    depth_costs,
    expected_tokens,
    tree_shape,
)

VERIFY = ((0, 1.0), (1, 1.03), (2, 1.12), (3, 1.22), (4, 1.45), (6, 1.7), (8, 2.3), (12, 2.8),
          (16, 4.6))  # c_verify(n) measured on Zen 4 (compiled, embedded-q4:a8), 2026-12-04
SHAPES = {  # an eesd-like 16-deep chain and mcsd's 2x2 tree, at their measured prices
    "chain": (CostProfile("chain", 0.19, VERIFY, c_round=0.15), chain_shape(16)),
    "2x2": (CostProfile("2x2", 0.21, VERIFY, c_round=0.22), tree_shape((2, 2))),
}


def run(profile: CostProfile, shape, accept: float, policy: str, rounds: int, seed: int) -> float:
    """Tokens per plain-round time of one simulated run."""
    rnd = random.Random(seed)
    switch = CostSwitch(profile, shape.depth)
    post = switch.posterior
    counts = [[0.0, 0.0] for _ in range(shape.depth)]  # the run's own (accepted, rejected)
    if policy == "run mean":
        def fade() -> None:  # towards Beta(2 m, 2 (1 - m)), m the run's mean (shrunk to 0.5)
            g = post.discount
            for d, (acc, rej) in enumerate(counts):
                m = (acc + 1.0) / (acc + rej + 2.0)
                post.alpha[d] = 2 * m + g * (post.alpha[d] - 2 * m)
                post.beta[d] = 2 * (1 - m) + g * (post.beta[d] - 2 * (1 - m))
        post.fade = fade
    costs = (1.0,) + depth_costs(profile, shape)
    gen = torch.Generator()
    tokens = time = 0.0
    for _ in range(rounds):
        depth = switch.decide(shape, gen)
        if depth == 0:
            tokens, time = tokens + 1, time + 1
            keep = post.discount
            if policy == "slow":
                post.discount = keep ** 0.25
            switch.observe(0, 0)
            post.discount = keep
            continue
        passed = 0
        while passed < depth and rnd.random() < accept:
            passed += 1
        for d in range(passed):
            counts[d][0] += 1
        if passed < depth:
            counts[passed][1] += 1
        tokens, time = tokens + passed + 1, time + costs[depth]
        switch.observe(depth, passed)
    return tokens / time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    policies = ("prior", "slow", "run mean")
    for name, (profile, shape) in SHAPES.items():
        print(f"{name}, {args.rounds} rounds, mean of {args.seeds} seeds")
        c = depth_costs(profile, shape)
        for a in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            best = max([1.0] + [expected_tokens([a] * d) / c[d - 1]
                                for d in range(1, shape.depth + 1)])
            got = [sum(run(profile, shape, a, p, args.rounds, s) for s in range(args.seeds))
                   / args.seeds for p in policies]
            print(f"  a={a}: best {best:.3f}  " + "  ".join(
                f"{p} {v:.3f}" for p, v in zip(policies, got)))


if __name__ == "__main__":
    main()
