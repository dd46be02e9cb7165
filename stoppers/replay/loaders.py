"""Read recorded rewards into a :class:`RewardPool` (prompts x candidate rewards).

Three input shapes are accepted:

* ``.npy`` — a 2-D float array ``[prompts, samples]``;
* ``.npz`` — the same array under a selectable key (``--key``, default ``rewards``);
* ``.jsonl`` — the authors' format (``yhkalayci/adaptive-BoN``): one prompt a line,
  ``{"prompt": ..., "generations": [{"text": ..., "<rm>_reward": float}, ...]}``; the reward
  field is selectable (``--field mistral_rm`` or ``--field mistral_rm_reward``) and is detected
  when the file carries exactly one ``*_reward`` field.

NaN (or a null JSON reward) marks a missing sample: it is dropped from that prompt only and
counted in :attr:`RewardPool.missing`, so ragged pools replay without padding artefacts.
Every problem raises :class:`ReplayInputError` with one sentence naming the file and the fault.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ReplayInputError", "RewardPool", "load_rewards", "pool_from_matrix"]

MIN_SAMPLES = 2


class ReplayInputError(ValueError):
    """Bad replay input; the message is a single line meant for the terminal."""


@dataclass(frozen=True)
class RewardPool:
    """Per-prompt candidate rewards (each prompt may have its own count after NaN removal)."""

    rewards: tuple[np.ndarray, ...]
    source: str
    missing: int = 0

    @property
    def prompts(self) -> int:
        return len(self.rewards)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(r) for r in self.rewards], dtype=np.int64)

    @property
    def max_samples(self) -> int:
        return int(self.sizes.max())

    @property
    def min_samples(self) -> int:
        return int(self.sizes.min())

    def head(self, prompts: int) -> RewardPool:
        """The first ``prompts`` prompts (for quick runs and benchmarks)."""
        return RewardPool(self.rewards[:prompts], self.source, self.missing)


def pool_from_matrix(matrix: np.ndarray, source: str = "<array>") -> RewardPool:
    """Build a pool from a ``[prompts, samples]`` array; NaN entries are dropped per prompt."""
    array = np.asarray(matrix)
    if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
        raise ReplayInputError(f"{source}: rewards must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if array.ndim == 1:
        raise ReplayInputError(
            f"{source}: expected a 2-D [prompts, samples] matrix, got a 1-D array of "
            f"{array.shape[0]} values"
        )
    if array.ndim != 2:
        raise ReplayInputError(
            f"{source}: expected a 2-D [prompts, samples] matrix, got shape {array.shape}"
        )
    if array.shape[0] == 0:
        raise ReplayInputError(f"{source}: the matrix has no prompts")
    if np.isinf(array).any():
        raise ReplayInputError(f"{source}: rewards contain ±inf (use NaN for missing samples)")
    rows = []
    missing = 0
    for i, row in enumerate(array):
        kept = row[~np.isnan(row)]
        missing += row.size - kept.size
        _check_row(source, i, kept)
        rows.append(np.ascontiguousarray(kept))
    return RewardPool(tuple(rows), source, missing)


def load_rewards(
    path: str | Path, *, key: str | None = None, field: str | None = None
) -> RewardPool:
    """Load a reward pool from ``.npy``, ``.npz`` or ``.jsonl`` (see the module docstring)."""
    file = Path(path)
    if not file.exists():
        raise ReplayInputError(f"{file}: no such file")
    if file.is_dir():
        raise ReplayInputError(f"{file}: is a directory, expected a .npz, .npy or .jsonl file")
    suffix = file.suffix.lower()
    if suffix == ".npz":
        return _load_npz(file, key or "rewards")
    if suffix == ".npy":
        return pool_from_matrix(_np_load(file), str(file))
    if suffix in {".jsonl", ".json"}:
        return _load_jsonl(file, field)
    raise ReplayInputError(f"{file}: unknown file type {suffix!r} (expected .npz, .npy or .jsonl)")


def load_task_labels(path: str | Path, name: str) -> list[str]:
    """One task label per prompt: the 1-D array ``name`` of an ``.npz`` (e.g. the ``family``
    that ``pandora synth`` records), for replays whose priors are keyed by task."""
    file = Path(path)
    if file.suffix.lower() != ".npz":
        raise ReplayInputError(f"{file}: task labels are read from a .npz, not a {file.suffix!r}")
    archive = _np_load(file)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ReplayInputError(f"{file}: holds one array, no task labels named {name!r}")
    with archive:
        if name not in archive.files:
            raise ReplayInputError(
                f"{file}: no array named {name!r} (available: {', '.join(archive.files)})"
            )
        labels = archive[name]
    if labels.ndim != 1:
        raise ReplayInputError(
            f"{file}[{name}]: task labels must be 1-D (one per prompt), got shape {labels.shape}"
        )
    return [str(v) for v in labels.tolist()]


def _np_load(file: Path):
    try:
        return np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ReplayInputError(f"{file}: cannot read as numpy data ({exc})") from None


def _load_npz(file: Path, key: str) -> RewardPool:
    archive = _np_load(file)
    if not isinstance(archive, np.lib.npyio.NpzFile):
        return pool_from_matrix(archive, str(file))
    with archive:
        if key not in archive.files:
            raise ReplayInputError(
                f"{file}: no array named {key!r} (available: {', '.join(archive.files) or 'none'})"
            )
        try:
            matrix = archive[key]
        except ValueError as exc:
            raise ReplayInputError(f"{file}: cannot read array {key!r} ({exc})") from None
    return pool_from_matrix(matrix, f"{file}[{key}]")


def _load_jsonl(file: Path, field: str | None) -> RewardPool:
    rows: list[np.ndarray] = []
    missing = 0
    resolved: str | None = None
    with file.open("r", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{file}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReplayInputError(f"{where}: not valid JSON ({exc.msg})") from None
            generations = record.get("generations") if isinstance(record, dict) else None
            if not isinstance(generations, list):
                raise ReplayInputError(f"{where}: expected an object with a 'generations' list")
            if resolved is None:
                resolved = _resolve_field(where, generations, field)
            values = []
            for j, gen in enumerate(generations):
                if not isinstance(gen, dict) or resolved not in gen:
                    raise ReplayInputError(f"{where}: generation {j} has no {resolved!r} field")
                value = gen[resolved]
                if value is None:
                    missing += 1
                    continue
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ReplayInputError(
                        f"{where}: generation {j} field {resolved!r} is not a number: {value!r}"
                    )
                if math.isnan(value):
                    missing += 1
                    continue
                if math.isinf(value):
                    raise ReplayInputError(f"{where}: generation {j} reward is infinite")
                values.append(float(value))
            kept = np.asarray(values, dtype=np.float64)
            _check_row(str(file), len(rows), kept, line=line_no)
            rows.append(kept)
    if not rows:
        raise ReplayInputError(f"{file}: no prompts (the file is empty)")
    return RewardPool(tuple(rows), f"{file}[{resolved}]", missing)


def _resolve_field(where: str, generations: list, field: str | None) -> str:
    keys = set()
    for gen in generations:
        if isinstance(gen, dict):
            keys.update(k for k in gen if isinstance(k, str))
    if field is not None:
        if field in keys:
            return field
        if f"{field}_reward" in keys:
            return f"{field}_reward"
        # Not in the first record: keep the name so the per-generation check names it.
        return field if field.endswith("_reward") else f"{field}_reward"
    candidates = sorted(k for k in keys if k.endswith("_reward"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ReplayInputError(f"{where}: no '<name>_reward' field in the generations")
    raise ReplayInputError(
        f"{where}: several reward fields ({', '.join(candidates)}); choose one with --field"
    )


def _check_row(source: str, index: int, kept: np.ndarray, line: int | None = None) -> None:
    if kept.size < MIN_SAMPLES:
        where = f"line {line}" if line is not None else f"prompt {index}"
        raise ReplayInputError(
            f"{source}: {where} has {kept.size} usable sample(s); replay needs at least "
            f"{MIN_SAMPLES} per prompt"
        )
