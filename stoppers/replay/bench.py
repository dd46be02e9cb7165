"""Benchmark: the vectorised replay vs the per-object ``observe`` loop (a script, not a test).

    python -m stoppers.replay.bench [--prompts 200] [--samples 960] [--permutations 100]
                                    [--cost 0.001] [--family mixed] [--loop-prompts 4]

1. Full run: ``pandora synth``-style pool, then the profit experiment at one cost with
   AdaptiveBestOfN over all prompts (vectorised engine, all cores) — the issue's target is
   <= 60 s for 200 x 960 x 100.
2. Side by side in one process, the policy run alone: vectorised on one engine-sized chunk
   (``--chunk`` prompts, all orderings) and the per-object loop on the first ``--loop-prompts``
   prompts; the ratio is per ordering run, and the loop's full-size time is extrapolated from
   it (linear in prompts x orderings).
3. Agreement: the two paths' sample counts and kept rewards on the loop's runs (must be
   identical).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from stoppers.replay.batch import PromptBatch
from stoppers.replay.engine import ReplayConfig, run_policy, run_replay
from stoppers.replay.loaders import pool_from_matrix
from stoppers.replay.policies import resolve_policy
from stoppers.replay.synth import SynthSpec, generate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--samples", type=int, default=960)
    ap.add_argument("--permutations", type=int, default=100)
    ap.add_argument("--cost", type=float, default=0.001)
    ap.add_argument("--family", default="mixed")
    ap.add_argument("--policy", default="adaptive")
    ap.add_argument("--loop-prompts", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=25, help="prompts in the side-by-side chunk")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    spec = SynthSpec(family=args.family, prompts=args.prompts, samples=args.samples, seed=args.seed)
    pool = pool_from_matrix(generate(spec)["rewards"], f"synth:{args.family}")
    config = ReplayConfig(
        policy=args.policy,
        profit_costs=(args.cost,),
        permutations=args.permutations,
        seed=args.seed,
    )
    print(
        f"pool {args.prompts} x {args.samples} ({args.family}), {args.permutations} orderings, "
        f"policy {args.policy}, cost {args.cost}, {args.jobs} jobs"
    )
    t = time.perf_counter()
    summaries = run_replay(pool, config, jobs=args.jobs)
    full = time.perf_counter() - t
    mean_n = float(np.mean(summaries.policy_samples[0]))
    print(f"full profit experiment, vectorised: {full:.1f} s (mean samples {mean_n:.1f})")

    # Side by side, one process: the policy alone on one engine-sized chunk (vectorised) and on
    # the first --loop-prompts prompts (loop, then scaled per ordering run).
    chunk = min(args.chunk, args.prompts)
    k = min(args.loop_prompts, chunk)
    batch = PromptBatch.build(
        pool.rewards[:chunk],
        range(chunk),
        permutations=args.permutations,
        seed=args.seed,
        alpha=0.99,
    )
    small = PromptBatch.build(
        pool.rewards[:k], range(k), permutations=args.permutations, seed=args.seed, alpha=0.99
    )
    choice = resolve_policy(args.policy)
    t = time.perf_counter()
    (fast,) = run_policy(batch, choice, (args.cost,), config)
    t_fast = time.perf_counter() - t
    loop_config = ReplayConfig(**{**config.__dict__, "use_loop": True})
    t = time.perf_counter()
    (slow,) = run_policy(small, choice, (args.cost,), loop_config)
    t_loop = time.perf_counter() - t
    rows = small.rows  # prompt-major: the first k prompts are the chunk's first rows
    same_n = float(np.mean(fast.n[:rows] == slow.n))
    same_best = float(np.mean(fast.best[:rows] == slow.best))
    per_run_fast = t_fast / batch.rows
    per_run_loop = t_loop / small.rows
    print(
        f"policy only, one process: vectorised {t_fast:.2f} s for {chunk} prompts "
        f"({per_run_fast * 1e3:.2f} ms per ordering run); loop {t_loop:.2f} s for {k} prompts "
        f"({per_run_loop * 1e3:.2f} ms per ordering run): {per_run_loop / per_run_fast:.1f}x; "
        f"identical n {same_n:.4f}, identical best {same_best:.4f} on the loop's {rows} runs"
    )
    loop_full = per_run_loop * args.prompts * args.permutations
    print(
        f"loop extrapolated to {args.prompts} prompts x {args.permutations} orderings: "
        f"{loop_full:.0f} s on one core (~{loop_full / args.jobs:.0f} s on {args.jobs}) vs "
        f"{full:.1f} s for the whole vectorised experiment: {loop_full / args.jobs / full:.1f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
