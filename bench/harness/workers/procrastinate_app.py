"""The procrastinate app of the benchmark: one no-op task, ``noop``.

In a module of its own, as procrastinate wants (not in the script that runs it).
"""

from __future__ import annotations

import procrastinate

processed = 0


def build_app(dsn: str, *, pool_size: int = 4) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    )

    @app.task(name="noop")
    async def noop(n: int, tenant: int = 0, pad: str = "") -> None:
        global processed
        processed += 1

    return app
