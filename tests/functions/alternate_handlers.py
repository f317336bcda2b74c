"""A handlers module whose registry has another name (LEASEQ_HANDLERS=module:jobs)."""

from leaseq import Registry

jobs = Registry()
jobs.register("alternate.kind", lambda payload, ctx: None)
