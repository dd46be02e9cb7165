"""Cancelling work that runs httpx without breaking httpcore's connection bookkeeping.

httpcore closes a response (marks its connection idle, or closes it, and forgets the pool
request) inside anyio *shielded* cancel scopes. A shield holds back anyio cancellation, but not a
native ``asyncio.Task.cancel()``: one that lands while a finished response is being closed leaves
the connection ACTIVE and its pool request counted for the life of the process, and one that
lands between connecting and sending leaves a NEW connection nothing will ever use
(encode/httpcore#1115, encode/httpx#3782; both open against httpcore 1.0.9). Every early stop
cancels candidates that may be exactly there, so on the httpx transport (HTTPS and proxied
upstreams) the gateway leaked a socket now and then, for good.

Cancelling through an anyio cancel scope instead is delivered only outside shields, so
httpcore's cleanup always runs whole. So work that runs httpx runs in a task of its own that is
cancelled through a scope - a :class:`ScopedTask`, :func:`run_scoped`, or an anyio task group
(the reward clients, which cannot import this) - and whatever cancels its caller natively (a
deadline, a client that hangs up) reaches it through that scope, never directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, Generic, TypeVar

import anyio

__all__ = ["ScopedTask", "cancel_all", "run_scoped"]

T = TypeVar("T")


class ScopedTask(Generic[T]):
    """An asyncio task whose :meth:`cancel` goes through an anyio cancel scope.

    The task ends cancelled (``task.cancelled()``) when the scope stopped it, with its result
    when it finished anyway (cancellation arrived while it was closing), or with its own error.
    ``scoped=False`` makes it a plain task cancelled natively, for work whose cleanup never
    waits (the lean HTTP client): a cancel scope costs ~6 us per task, paid per candidate.
    """

    __slots__ = ("_scope", "task")

    def __init__(self, coro: Coroutine[Any, Any, T], *, scoped: bool = True) -> None:
        self._scope = anyio.CancelScope() if scoped else None
        self.task: asyncio.Task[T] = asyncio.create_task(self._run(coro) if scoped else coro)

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._scope is not None
        with self._scope:
            return await coro
        raise asyncio.CancelledError  # the scope absorbed its own cancellation: report one

    def cancel(self) -> None:
        if self._scope is None:
            self.task.cancel()
        else:
            self._scope.cancel()


async def cancel_all(tasks: Iterable[ScopedTask[Any]]) -> None:
    """Cancel every task (through its scope, when it has one) and wait until each has ended.

    A cancellation of the caller meanwhile is held back until they have (they unwind in a few
    event-loop steps) and then raised: ``asyncio.gather`` would pass it on to them natively,
    which is what this module exists to avoid, and returning early would orphan them.
    """
    scoped = list(tasks)
    for task in scoped:
        task.cancel()
    pending = {task.task for task in scoped}
    interrupted = False
    with anyio.CancelScope(shield=True):  # the caller's scope cancellation waits till we end
        while pending:
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:  # native: keep reaping, raise it afterwards
                interrupted = True
            pending = {task for task in pending if not task.done()}
    if interrupted:
        raise asyncio.CancelledError


async def run_scoped(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in a :class:`ScopedTask`: when the caller is cancelled, natively or not, the
    work is cancelled through its scope and waited for, then the cancellation goes on.

    For work whose result needs no cleanup (it is dropped when the caller is cancelled).
    """
    scoped = ScopedTask(coro)
    try:
        return await asyncio.shield(scoped.task)
    except asyncio.CancelledError:
        await cancel_all([scoped])
        if not scoped.task.cancelled():
            scoped.task.exception()  # retrieved: an error it ended with is moot, not "unhandled"
        raise
