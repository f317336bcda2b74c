"""A handlers module that forgot to register anything (for the runtime's error)."""

from leaseq import Registry

registry = Registry()
