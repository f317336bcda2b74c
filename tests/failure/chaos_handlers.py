"""Handlers of the chaos kinds (see chaos_kinds.py), run inside the worker processes.

Every handler that returns success first writes its side effect to
``public.side_effects`` over a connection of its own, committed before it returns.
The row carries the lease token the handler ran under, so the audit can tell a
second execution (allowed: at-least-once) from a second completion (never allowed),
and can check that every recorded success was produced by an execution that ran.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from leaseq import DiscardJob, JobContext, Registry, RetryPolicy
from pydantic import BaseModel

from tests.failure.chaos_kinds import SHORT_TIMEOUT

RECORD_EFFECT = (
    "insert into public.side_effects (job_id, lease_token, attempt, kind, worker)"
    " values (%s, %s, %s, %s, %s)"
)


class SideEffects:
    """The handlers' own connection, separate from the queue's, reopened when broken."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], worker: str) -> None:
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None
        self.worker = worker

    def record(self, context: JobContext) -> None:
        job = context.job
        params = (job.id, job.lease_token, job.attempts, job.kind, self.worker)
        for last_try in (False, True):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = self._connect()
                self._conn.execute(RECORD_EFFECT, params)
                return
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                if last_try:
                    raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class TypedPayload(BaseModel):
    amount: int


def build_registry(effects: SideEffects) -> Registry:
    registry = Registry()
    # Kinds without their own time budget get WorkerConfig.job_timeout.
    no_retry_wait = RetryPolicy(base_delay=0.05, max_delay=0.5)

    def ok(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        time.sleep(random.uniform(0.0, 0.002))
        effects.record(context)
        return {"n": payload.get("n")}

    def flaky(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt <= int(payload.get("fail_times", 1)):
            raise RuntimeError(f"flaky failure on attempt {context.attempt}")
        return ok(payload, context)

    def overrun(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            time.sleep(SHORT_TIMEOUT * 3)
        return ok(payload, context)

    def hang(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            while True:
                time.sleep(3600)
        return ok(payload, context)

    def crash(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            effects.record(context)
            os.kill(os.getpid(), signal.SIGKILL)
        return ok(payload, context)

    def poison(payload: dict[str, Any], context: JobContext) -> None:
        raise DiscardJob("the payload is poison; retrying cannot help")

    def doomed(payload: dict[str, Any], context: JobContext) -> None:
        raise RuntimeError(f"doomed on attempt {context.attempt}")

    def typed(payload: TypedPayload, context: JobContext) -> dict[str, Any]:
        effects.record(context)
        return {"amount": payload.amount}

    registry.register("chaos.ok", ok)
    registry.register("chaos.flaky", flaky, retry=no_retry_wait)
    registry.register("chaos.overrun", overrun, timeout=SHORT_TIMEOUT)
    registry.register("chaos.hang", hang, timeout=SHORT_TIMEOUT)
    registry.register("chaos.crash", crash)
    registry.register("chaos.poison", poison)
    registry.register("chaos.doomed", doomed)
    registry.register("chaos.typed", typed, payload=TypedPayload)
    return registry


class AsyncSideEffects:
    """:class:`SideEffects` for ``async def`` handlers: one async connection shared by
    the jobs of an event loop, reopened when broken.

    The worker may run a later batch on a new event loop while a task of an abandoned one
    still holds the lock (a batch stopped at its deadline), so the lock and the
    connection belong to the loop that made them and a new loop makes its own."""

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                 worker: str) -> None:
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self.worker = worker

    async def record(self, context: JobContext) -> None:
        job = context.job
        params = (job.id, job.lease_token, job.attempts, job.kind, self.worker)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._lock, self._conn = loop, asyncio.Lock(), None
        async with self._lock:
            for last_try in (False, True):
                try:
                    if self._conn is None or self._conn.closed or self._conn.broken:
                        self._conn = await self._connect()
                    await self._conn.execute(RECORD_EFFECT, params)
                    return
                except psycopg.OperationalError:
                    if self._conn is not None:
                        await self._conn.close()
                    self._conn = None
                    if last_try:
                        raise


def build_async_registry(connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                         worker: str) -> Registry:
    """The chaos kinds with ``async def`` handlers: overruns and hangs are cancelled at
    their budget instead of interrupted, and many run at once in one process."""
    effects = AsyncSideEffects(connect, worker)
    registry = Registry()
    no_retry_wait = RetryPolicy(base_delay=0.05, max_delay=0.5)

    async def ok(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.0, 0.002))
        await effects.record(context)
        return {"n": payload.get("n")}

    async def flaky(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt <= int(payload.get("fail_times", 1)):
            raise RuntimeError(f"flaky failure on attempt {context.attempt}")
        return await ok(payload, context)

    async def overrun(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            await asyncio.sleep(SHORT_TIMEOUT * 3)
        return await ok(payload, context)

    async def hang(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            await asyncio.Event().wait()
        return await ok(payload, context)

    async def crash(payload: dict[str, Any], context: JobContext) -> dict[str, Any]:
        if context.attempt == 1:
            await effects.record(context)
            os.kill(os.getpid(), signal.SIGKILL)
        return await ok(payload, context)

    async def poison(payload: dict[str, Any], context: JobContext) -> None:
        raise DiscardJob("the payload is poison; retrying cannot help")

    async def doomed(payload: dict[str, Any], context: JobContext) -> None:
        raise RuntimeError(f"doomed on attempt {context.attempt}")

    async def typed(payload: TypedPayload, context: JobContext) -> dict[str, Any]:
        await effects.record(context)
        return {"amount": payload.amount}

    registry.register("chaos.ok", ok)
    registry.register("chaos.flaky", flaky, retry=no_retry_wait)
    registry.register("chaos.overrun", overrun, timeout=SHORT_TIMEOUT)
    registry.register("chaos.hang", hang, timeout=SHORT_TIMEOUT)
    registry.register("chaos.crash", crash)
    registry.register("chaos.poison", poison)
    registry.register("chaos.doomed", doomed)
    registry.register("chaos.typed", typed, payload=TypedPayload)
    return registry
