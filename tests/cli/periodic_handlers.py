"""A handlers module with schedules beside its handlers, for ``leaseq schedules sync``."""

from __future__ import annotations

from typing import Any

from leaseq import Registry

registry = Registry()


@registry.periodic("*/5 * * * *", tz="Europe/Berlin", payload={"scope": "all"})
@registry.handler("cleanup")
def cleanup(payload: dict[str, Any], ctx: Any) -> None:
    """Runs every five minutes, Berlin time, in the shared tenant."""
