"""Deleting finished jobs older than an age, page by page: the one loop behind the
reaper's retention period and an operator's prune.

Each page is one call of a bounded SQL function, its own short transaction: the
reaper's ``app.prune_retained_jobs`` (it refuses an age below the floor the schema owner
sets) or the operator's ``app.prune_jobs`` (any age). So deleting a large backlog never
holds many row locks or one long transaction. The loop stops at the first page that
comes back short (nothing older is left), after ``max_pages`` pages, or as soon as
``keep_going()`` answers False before a page (the reaper's deadline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

#: One page: (age, page size) -> (jobs deleted, events deleted), as the client's
#: ``prune_jobs`` and ``prune_retained_jobs`` are.
PrunePage = Callable[[timedelta, int], tuple[int, int]]


@dataclass
class PruneReport:
    """What :func:`prune_in_pages` deleted, and in how many pages."""

    jobs_deleted: int = 0
    events_deleted: int = 0
    batches: int = 0


def prune_in_pages(prune: PrunePage, older_than: timedelta, *, limit: int,
                   max_pages: int | None = None,
                   keep_going: Callable[[], bool] = lambda: True) -> PruneReport:
    """Call ``prune(older_than, limit)`` until a page comes back short, ``max_pages``
    pages have run, or ``keep_going()`` is False (see the module doc)."""
    report = PruneReport()
    while (max_pages is None or report.batches < max_pages) and keep_going():
        jobs, events = prune(older_than, limit)
        report.batches += 1
        report.jobs_deleted += jobs
        report.events_deleted += events
        if jobs < limit:
            break
    return report
