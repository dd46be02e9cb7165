"""`pandora replay` and `pandora synth` (registered by the `pandora` dispatcher).

Imports nothing heavy at module level: matplotlib and tqdm are loaded inside the run
functions. Bad input ends with one ``pandora replay: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["register"]

DEFAULT_PROFIT_COSTS = (0.002, 0.001, 0.0004, 0.0002)
DEFAULT_WINRATE_COSTS = tuple(float(f"{c:.3g}") for c in np.logspace(-5, -3, 9))
DEFAULT_TARGETS = tuple(round(0.6 + 0.05 * i, 2) for i in range(9))
POLICIES = (
    "adaptive",
    "target",
    "ucb-exp",
    "beacon",
    "patience",
    "tail-cost",
    "shape-cost",
    "bayes-shape-cost",
)
TARGET_POLICIES = ("target", "tail-target", "pooled-target")


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_replay(subparsers)
    _register_synth(subparsers)


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _option(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return name, value


def _register_replay(subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay a stopping policy on recorded rewards (the paper's three experiments)",
        description=(
            "Replay a stopping policy on a [prompts x samples] reward matrix (.npz/.npy) or the "
            "authors' JSONL, over seeded random orderings, and compare it with fixed Best-of-N: "
            "profit vs the best fixed N, win rate at a matched budget, savings at a target "
            "acceptance rate. Writes DIR/results.json and PNG figures."
        ),
    )
    p.add_argument("file", metavar="FILE", help=".npz, .npy or .jsonl rewards")
    p.add_argument("--key", default="rewards", help="array name inside a .npz (default: rewards)")
    p.add_argument("--field", help="JSONL reward field, e.g. mistral_rm or mistral_rm_reward")
    p.add_argument("--experiment", choices=("profit", "winrate", "savings", "all"), default="all")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="adaptive",
        help="policy for the profit and win-rate experiments (savings always uses "
        "the target-acceptance policy)",
    )
    p.add_argument(
        "--costs",
        type=_floats,
        help="costs per sample for profit and win rate (default: the paper's, "
        f"profit {','.join(map(str, DEFAULT_PROFIT_COSTS))}; win rate 9 points "
        "log-spaced in 1e-5..1e-3)",
    )
    p.add_argument(
        "--target-policy",
        choices=TARGET_POLICIES,
        default="target",
        help="target-acceptance policy of the savings experiment (default: the paper's)",
    )
    p.add_argument("--targets", type=_floats, help="target acceptance rates (default 0.6..1.0)")
    p.add_argument(
        "--permutations",
        type=_positive_int,
        default=100,
        help="random orderings per prompt (default 100)",
    )
    p.add_argument(
        "--max-samples",
        type=_positive_int,
        help="sample budget per request (default: the prompt's pool size)",
    )
    p.add_argument(
        "--min-samples",
        type=_positive_int,
        help="samples before the adaptive policies may stop (default: the policy's)",
    )
    p.add_argument("--alpha", type=float, default=0.99, help="benchmark percentile (0.99)")
    p.add_argument("--delta", type=float, help="confidence parameter (default: the policy's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orderings (default 0)")
    p.add_argument(
        "--policy-option",
        action="append",
        type=_option,
        default=[],
        metavar="NAME=VALUE",
        help="extra policy constructor keyword, e.g. empty_tail=stop (repeatable; "
        "VALUE is parsed as JSON when it can be)",
    )
    p.add_argument("--prompts", type=_positive_int, help="replay only the first N prompts")
    p.add_argument("--out", default="replay-out", help="output directory (default replay-out)")
    p.add_argument("--jobs", type=_positive_int, help="worker processes (default: all cores)")
    p.add_argument(
        "--loop",
        action="store_true",
        help="use the per-object observe loop even where a vectorised path exists",
    )
    p.add_argument(
        "--deployment",
        action="store_true",
        help="sequential replay: each ordering is one deployment serving the prompts in a random "
        "order, with one deployment prior the policy learns from (profit and savings only; "
        "see stoppers/replay/deployment.py)",
    )
    p.add_argument(
        "--warm-after",
        type=_positive_int,
        default=0,
        help="with --deployment: also report the experiments on the prompts served after the "
        "prior had learned from this many requests",
    )
    p.add_argument(
        "--task-key",
        metavar="ARRAY",
        help="with --deployment: one prior per task, the task of each prompt read from this 1-D "
        "array of the .npz (e.g. 'family', which pandora synth records), as the gateway's "
        "X-Pandora-Task keys its priors",
    )
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    p.set_defaults(func=run_replay_command)


def _register_synth(subparsers) -> None:
    from stoppers.replay.synth import FAMILIES, PRECISIONS

    p = subparsers.add_parser(
        "synth",
        help="write a seeded synthetic reward matrix for replay experiments",
        description=(
            "Generate a [prompts x samples] reward matrix whose per-prompt location and scale "
            "vary across prompts like real reward models; see stoppers/replay/synth.py."
        ),
    )
    p.add_argument("out", metavar="OUT", help="output .npz (array 'rewards' plus metadata)")
    p.add_argument("--family", choices=FAMILIES, default=None, help="default: normal")
    p.add_argument(
        "--from-pool",
        metavar="FILE",
        help=(
            "redraw a recorded pool (.npz/.npy/.jsonl) to --samples per prompt instead of a "
            "family: a smoothed bootstrap of each row, clipped scores kept "
            "(stoppers/replay/smoothed.py); --prompts caps the rows"
        ),
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        default=0.5,
        help="with --from-pool: sd of the jitter added to each unclipped reward (reward units)",
    )
    p.add_argument("--prompts", type=_positive_int, default=200)
    p.add_argument("--samples", type=_positive_int, default=960)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loc-spread", type=float, default=2.0, help="sd of per-prompt location")
    p.add_argument("--loc-mean", type=float, default=0.0, help="mean of per-prompt location")
    p.add_argument("--scale-median", type=float, default=1.0, help="median per-prompt scale")
    p.add_argument("--scale-spread", type=float, default=0.4, help="sd of log per-prompt scale")
    p.add_argument("--bound", type=float, default=2.0, help="clip bound of 'clipped'")
    p.add_argument(
        "--resolution", type=float, default=0.1, help="rounding step of 'clipped' and 'rounded'"
    )
    p.add_argument(
        "--missing-fraction",
        type=float,
        default=0.0,
        help="fraction of entries set to NaN (missing samples)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float64",
        help="round the rewards to this format (bfloat16: a reward model on a GPU)",
    )
    p.set_defaults(func=run_synth_command)


def _run_smoothed(args: argparse.Namespace) -> int:
    """``pandora synth --from-pool``: a recorded pool redrawn to ``--samples`` per prompt."""
    from stoppers.replay.loaders import ReplayInputError, load_rewards
    from stoppers.replay.smoothed import smoothed_pool

    out = Path(args.out)
    try:
        source = load_rewards(args.from_pool)
    except ReplayInputError as exc:
        return _fail("synth", str(exc))
    try:
        rewards = smoothed_pool(
            source.rewards,
            samples=args.samples,
            bandwidth=args.bandwidth,
            seed=args.seed,
            prompts=args.prompts,
        )
    except ValueError as exc:
        return _fail("synth", str(exc))
    meta = {
        "from_pool": str(args.from_pool),
        "prompts": int(rewards.shape[0]),
        "bandwidth": args.bandwidth,
        "samples": args.samples,
        "seed": args.seed,
    }
    if not _saved(out, meta, {"rewards": rewards}):
        return 2
    print(
        f"wrote {out}: rewards [{rewards.shape[0]} x {rewards.shape[1]}] redrawn from "
        f"{args.from_pool} (bandwidth {args.bandwidth:g}), seed {args.seed}"
    )
    return 0


def _saved(out: Path, meta: dict, arrays: dict[str, np.ndarray]) -> bool:
    """Write a synthetic pool (its ``meta`` as JSON beside the arrays); False, with the error
    said, where it cannot be written."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(out, meta=np.array(json.dumps(meta)), **arrays)
    except OSError as exc:
        _fail("synth", f"{out}: cannot write ({exc.strerror})")
        return False
    return True


def _fail(command: str, message: str) -> int:
    print(f"pandora {command}: error: {message}", file=sys.stderr)
    return 2


def run_synth_command(args: argparse.Namespace) -> int:
    from stoppers.replay.synth import SynthSpec, generate

    out = Path(args.out)
    if out.suffix != ".npz":
        return _fail("synth", f"{out}: the output must be a .npz file")
    if args.from_pool is not None:
        if args.family is not None:
            return _fail("synth", "--family does not apply with --from-pool (the pool's rows are)")
        return _run_smoothed(args)
    try:
        spec = SynthSpec(
            family=args.family or "normal",
            prompts=args.prompts,
            samples=args.samples,
            seed=args.seed,
            loc_spread=args.loc_spread,
            scale_median=args.scale_median,
            scale_spread=args.scale_spread,
            bound=args.bound,
            resolution=args.resolution,
            missing_fraction=args.missing_fraction,
            loc_mean=args.loc_mean,
            precision=args.precision,
        )
    except ValueError as exc:
        return _fail("synth", str(exc))
    arrays = generate(spec)
    if not _saved(out, spec.to_dict(), arrays):
        return 2
    missing = int(np.isnan(arrays["rewards"]).sum())
    print(
        f"wrote {out}: rewards [{spec.prompts} x {spec.samples}] family {spec.family}, "
        f"seed {spec.seed}, {missing} missing"
    )
    return 0


def run_replay_command(args: argparse.Namespace) -> int:
    from stoppers.replay.loaders import ReplayInputError
    from stoppers.replay.run import ReplayRequest, replay

    try:
        request = ReplayRequest.from_args(args)
        if args.task_key is not None and not args.deployment:
            raise ValueError("--task-key keys the deployment priors; it needs --deployment")
        if args.deployment:
            from stoppers.replay.deployment_run import run_deployment_request

            results, written = run_deployment_request(
                request, warm_after=args.warm_after, task_key=args.task_key
            )
        else:
            results, written = replay(request)
    except ReplayInputError as exc:
        return _fail("replay", str(exc))
    except ValueError as exc:
        return _fail("replay", str(exc))
    except OSError as exc:
        return _fail("replay", f"{exc.filename or args.out}: {exc.strerror or exc}")
    if not args.quiet:
        from stoppers.replay.results import format_table

        print(format_table(results))
        print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0
