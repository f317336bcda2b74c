"""The operator functions of sql/0006 as Python calls, on one worker-role connection.

Everything here goes through SECURITY DEFINER functions granted to leaseq_operator, so the
command line needs no table privilege and does exactly what a Lambda could do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, LiteralString
from uuid import UUID

from leaseq.db import Connection, translate_errors
from leaseq.queries import (
    CANCEL_JOBS,
    DEAD_JOBS,
    GET_JOB,
    JOB_TIMELINE,
    PRUNE_JOBS,
    QUEUE_DEPTH,
    QUEUE_STATUS,
    REDRIVE_JOBS,
)

#: The SQL functions' per-call bound for redrive and cancel.
MAX_BATCH = 1000


@dataclass(frozen=True)
class Selection:
    """Which jobs an operator command acts on: explicit ids, or filters (None = any)."""

    job_ids: tuple[UUID, ...] = ()
    tenant_id: UUID | None = None
    kind: str | None = None

    @property
    def everything(self) -> bool:
        return not self.job_ids and self.tenant_id is None and self.kind is None


@dataclass
class PruneReport:
    jobs_deleted: int = 0
    events_deleted: int = 0
    batches: int = 0


class Operator:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _rows(self, query: LiteralString, params: dict[str, Any]) -> list[dict[str, Any]]:
        with translate_errors():
            return self.conn.execute(query, params).fetchall()

    # Reads ----------------------------------------------------------------------------

    def queue_status(self, tenant_id: UUID | None = None) -> list[dict[str, Any]]:
        return self._rows(QUEUE_STATUS, {"tenant_id": tenant_id})

    def queue_depth_by_kind(self) -> list[dict[str, Any]]:
        """Unfinished jobs per kind (app.queue_depth: pending, ready, running, retry_wait;
        at most the 200 kinds that have waited longest)."""
        rows = self._rows(QUEUE_DEPTH, {"tenant_id": None, "kind": None, "limit": 1})
        return [row for row in rows if row["dimension"] == "kind"]

    def get_job(self, job_id: UUID) -> dict[str, Any] | None:
        rows = self._rows(GET_JOB, {"job_id": job_id})
        return rows[0] if rows else None

    def job_timeline(self, job_id: UUID, limit: int = 1000) -> list[dict[str, Any]]:
        return self._rows(JOB_TIMELINE, {"job_id": job_id, "limit": limit})

    def dead_jobs(self, tenant_id: UUID | None = None, kind: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
        return self._rows(DEAD_JOBS, {"tenant_id": tenant_id, "kind": kind, "limit": limit})

    # Changes --------------------------------------------------------------------------

    def _batched(self, query: LiteralString, actor: str, selection: Selection,
                 reason: str | None, limit: int | None) -> list[dict[str, Any]]:
        """Repeat a bounded call until it comes back short (or ``limit`` is reached).

        Each call is its own short transaction, so a redrive or cancel of a large
        backlog never holds many row locks at once.
        """
        done: list[dict[str, Any]] = []
        ids = list(selection.job_ids)
        id_chunks: Sequence[list[UUID] | None] = (
            [ids[i:i + MAX_BATCH] for i in range(0, len(ids), MAX_BATCH)] if ids else [None])
        for chunk in id_chunks:
            while limit is None or len(done) < limit:
                size = MAX_BATCH if limit is None else min(MAX_BATCH, limit - len(done))
                rows = self._rows(query, {
                    "actor": actor, "tenant_id": selection.tenant_id, "job_ids": chunk,
                    "kind": selection.kind, "limit": size, "reason": reason})
                done.extend(rows)
                if len(rows) < size:
                    break
        return done

    def redrive_jobs(self, actor: str, selection: Selection, *, reason: str | None = None,
                     limit: int | None = None) -> list[dict[str, Any]]:
        return self._batched(REDRIVE_JOBS, actor, selection, reason, limit)

    def cancel_jobs(self, actor: str, selection: Selection, *, reason: str | None = None,
                    limit: int | None = None) -> list[dict[str, Any]]:
        return self._batched(CANCEL_JOBS, actor, selection, reason, limit)

    def prune_jobs(self, older_than: timedelta, *, batch: int = 1000,
                   max_batches: int | None = None) -> PruneReport:
        report = PruneReport()
        while max_batches is None or report.batches < max_batches:
            (row,) = self._rows(PRUNE_JOBS, {"older_than": older_than, "limit": batch})
            report.batches += 1
            report.jobs_deleted += int(row["jobs_deleted"])
            report.events_deleted += int(row["events_deleted"])
            if row["jobs_deleted"] < batch:
                break
        return report
