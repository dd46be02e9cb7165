"""The gateway's learned deployment priors: one per (generator model, task, mode), kept across
requests.

Why: one request sees a handful of rewards, but the requests for one model share its reward
distribution's shape (see :mod:`stoppers.deployment`). :class:`PriorStore` hands the same
:class:`stoppers.DeploymentPrior` to every policy built for a model and mode, and learns from
each request that finished normally, with the rewards in the order the policy saw them.

- Keys are the ``model`` string as the request names it and the request's optional task
  (``X-Pandora-Task``): prompts of one model can differ in shape (code, chat, maths), and one prior
  fitted to all of them is a blend that fits none (docs/robust-stopping.md, "Task keys"). The store
  is an LRU bounded by ``max_models`` entries, so a client sending random model names or tasks
  cannot grow memory.
- Only the protocol is used (``update``, ``to_dict``); the concrete class comes from
  :func:`stoppers.new_deployment_prior`, and restoring a saved state uses that class's
  ``from_dict``. A state saved by another class (the default policy changed) is dropped with
  one warning: a fresh prior is safe, a misread one is not.
- Persistence is a small JSON file written atomically (temp file + ``os.replace``). It records
  which reward scores it learned from (``Settings.reward_identity``); a file saved under
  another reward backend or model is dropped the same way, since a prior learns one reward
  model's shape and scale (a file from before this record is restored, with one warning).
- A prior whose policy needs derived tables (the target prior's stop tables, ~0.1-0.3 s of CPU
  each; the cost prior's likelihood shape, ~0.1-3 s) gets them built off the event loop by
  :class:`server.table_builds.TableBuilds` (one worker thread); the store attaches it to every
  prior it creates or restores, and :meth:`PriorStore.aclose` stops it.

Single asyncio loop, no locks: every call happens on the gateway's event loop (table builds run
on copies of the prior's histograms and are installed back on the loop).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

import stoppers
from server.table_builds import MAX_PENDING, TableBuilds
from stoppers.deployment import DeploymentPrior, PriorMode
from stoppers.robust.shape_prior import ShapePrior

__all__ = ["POLICY_SHAPES", "PRIOR_MODES", "UPDATE_RESULTS", "PriorStore", "prior_mode_for"]

log = logging.getLogger(__name__)

PRIOR_MODES: tuple[PriorMode, ...] = ("cost", "target")
STATE_VERSION = 1
PriorKey = tuple[str, str | None, PriorMode]  # (model, task or None, mode)
UPDATE_RESULTS = ("learned", "skipped")  # update() returned True / False
POLICY_SHAPES = ("learned", "cold_start")  # the policy decided on the prior / ran its cold start
# Metric labels use the request modes (as every other ``mode`` label of the gateway does).
_REQUEST_MODE: dict[PriorMode, str] = {"cost": "adaptive", "target": "target"}


def _mode_counter(
    name: str, documentation: str, label: str, values: tuple[str, ...], registry: CollectorRegistry
) -> Counter:
    """A counter by request mode and ``label``, every series created at 0 up front."""
    counter = Counter(name, documentation, ("mode", label), registry=registry)
    for mode in PRIOR_MODES:
        for value in values:
            counter.labels(mode=_REQUEST_MODE[mode], **{label: value})
    return counter


def prior_mode_for(request_mode: str) -> PriorMode | None:
    """The prior a request's mode learns into: adaptive -> cost, target -> target, else none."""
    if request_mode == "adaptive":
        return "cost"
    if request_mode == "target":
        return "target"
    return None


def _class_name(prior: object) -> str:
    cls = type(prior)
    return f"{cls.__module__}.{cls.__qualname__}"


class PriorStore:
    """LRU of deployment priors keyed by (model, task, mode), optionally persisted to
    ``path``."""

    def __init__(
        self,
        *,
        max_models: int = 64,
        path: Path | None = None,
        save_every: int = 50,
        registry: CollectorRegistry | None = None,
        max_pending_builds: int = MAX_PENDING,
        reward_identity: str | None = None,
        target_scale_shrink: float = 1.0,
    ) -> None:
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models}")
        self.max_models = max_models
        self.path = path
        # the reward scores the priors learn from; state saved under another is not restored
        self.reward_identity = reward_identity
        # a setting of the target priors' tables (ShapePrior.scale_shrink), not persisted
        self.target_scale_shrink = target_scale_shrink
        self.save_every = save_every
        self._priors: OrderedDict[PriorKey, DeploymentPrior] = OrderedDict()
        self._since_save = 0
        registry = registry if registry is not None else CollectorRegistry()
        self.updates = _mode_counter(
            "pandora_prior_updates_total",
            "Finished requests offered to a deployment prior, by request mode (adaptive: the "
            "cost prior) and whether it learned from them (skipped: too few or tied rewards)",
            "result",
            UPDATE_RESULTS,
            registry,
        )
        self.models = Gauge(
            "pandora_prior_models",
            "Deployment priors held (one per model, task and mode; bounded LRU)",
            registry=registry,
        )
        self.policies = _mode_counter(
            "pandora_prior_policies_total",
            "Requests whose policy was given a deployment prior, by request mode and whether it "
            "decided on what the prior learned (learned) or ran its cold start (cold_start)",
            "shape",
            POLICY_SHAPES,
            registry,
        )
        self.builds = TableBuilds(max_pending=max_pending_builds, registry=registry)

    def __len__(self) -> int:
        return len(self._priors)

    def keys(self) -> list[PriorKey]:
        """Keys (model, task, mode) from least to most recently used."""
        return list(self._priors)

    def get(self, model: str, mode: PriorMode, task: str | None = None) -> DeploymentPrior:
        """The prior for ``model``, ``task`` and ``mode`` (created on first use; marks it
        recently used). Requests without a task share their model's untasked prior."""
        key = (model, task, mode)
        prior = self._priors.get(key)
        if prior is None:
            prior = stoppers.new_deployment_prior(mode)
            self._insert(key, prior)
        else:
            self._priors.move_to_end(key)
        return prior

    def _insert(self, key: PriorKey, prior: DeploymentPrior) -> None:
        if key[2] == "target" and isinstance(prior, ShapePrior):
            prior.scale_shrink = self.target_scale_shrink  # before any table is built
        self.builds.attach(prior)  # its tables are built on the worker thread, never inline
        self._priors[key] = prior
        self._priors.move_to_end(key)
        while len(self._priors) > self.max_models:
            self._priors.popitem(last=False)
        self.models.set(len(self._priors))

    def policy_built(self, mode: PriorMode, policy: object) -> None:
        """Count one request's policy by whether it decides on the learned prior."""
        learned = bool(getattr(policy, "uses_learned_prior", False))
        self.policies.labels(
            mode=_REQUEST_MODE[mode], shape=POLICY_SHAPES[0 if learned else 1]
        ).inc()

    def learn(self, mode: PriorMode, prior: DeploymentPrior, rewards: Sequence[float]) -> bool:
        """Feed one finished request's rewards (observation order) to ``prior``; count it; save
        every ``save_every`` requests when a state file is set."""
        learned = bool(prior.update(list(rewards)))
        result = UPDATE_RESULTS[0 if learned else 1]
        self.updates.labels(mode=_REQUEST_MODE[mode], result=result).inc()
        self._since_save += 1
        if self.path is not None and self._since_save >= self.save_every:
            self.save()
        return learned

    def open(self) -> None:
        """Start (again) accepting table builds; the app's lifespan calls it at start-up."""
        self.builds.open()

    async def aclose(self) -> None:
        """Stop the table builds (queued ones are dropped, a running one is awaited)."""
        await self.builds.aclose()

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "reward": self.reward_identity,
            "priors": [
                {
                    "model": model,
                    "task": task,
                    "mode": mode,
                    "class": _class_name(prior),
                    "state": prior.to_dict(),
                }
                for (model, task, mode), prior in self._priors.items()
            ],
        }

    def save(self) -> None:
        """Write the state atomically (a crash mid-write leaves the previous file intact)."""
        if self.path is None:
            return
        self._since_save = 0
        data = json.dumps(self.to_dict(), allow_nan=False)
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except (OSError, ValueError) as exc:
            log.warning("could not save the deployment priors to %s: %s", self.path, exc)

    def load(self) -> int:
        """Restore priors from ``path`` if it exists; returns how many were restored. Any state
        this version cannot read is dropped with one warning (the store starts fresh)."""
        if self.path is None or not self.path.exists():
            return 0
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            restored = self._restore(data)
        except Exception as exc:
            log.warning(
                "ignoring the saved deployment priors in %s (%s); starting fresh", self.path, exc
            )
            self._priors.clear()
            self.models.set(0)
            return 0
        log.info("restored %d deployment prior(s) from %s", restored, self.path)
        return restored

    def _restore(self, data: Any) -> int:
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"unknown state format (expected version {STATE_VERSION})")
        # a file saved before files recorded it: nothing says otherwise, and dropping every
        # prior on upgrade would be worse; the next save records the current identity
        legacy = "reward" not in data
        saved_under = data.get("reward")
        if self.reward_identity is not None and not legacy and saved_under != self.reward_identity:
            raise ValueError(
                f"learned from the rewards of {saved_under!r}; the gateway now scores "
                f"with {self.reward_identity!r}"
            )
        entries = data["priors"]
        if not isinstance(entries, list):
            raise ValueError("'priors' must be a list")
        restored: list[tuple[PriorKey, DeploymentPrior]] = []
        for entry in entries:
            # files saved before tasks existed have no "task": their priors are untasked
            model, task, mode = entry["model"], entry.get("task"), entry["mode"]
            if (
                not isinstance(model, str)
                or not (task is None or isinstance(task, str))
                or mode not in PRIOR_MODES
            ):
                raise ValueError(f"bad key ({model!r}, {task!r}, {mode!r})")
            cls = type(stoppers.new_deployment_prior(mode))
            expected = f"{cls.__module__}.{cls.__qualname__}"
            if entry["class"] != expected:
                raise ValueError(f"saved by {entry['class']}, the {mode} prior is now {expected}")
            restored.append(((model, task, mode), cls.from_dict(entry["state"])))  # type: ignore[attr-defined]
        for key, prior in restored:
            self._insert(key, prior)
        if legacy and restored and self.reward_identity is not None:
            log.warning(
                "%s does not say which reward scores its priors were learned from; assuming %r",
                self.path,
                self.reward_identity,
            )
        return len(restored)
