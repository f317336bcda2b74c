"""Time budgets: how long one handler run may take, and whether there is time to start it.

Vocabulary, used the same way in code, logs and docs:

* **timeout**: a setting: a kind's ``timeout=`` or the worker's ``job_timeout``;
* **budget**: the seconds one run of a handler gets (its kind's timeout, else the
  worker's); a run that outlasts it is interrupted (sync) or cancelled (async) and
  retried as ``JOB_TIMEOUT``;
* **time left**: seconds until the invocation's deadline (``Deadline.remaining()``);
* **worker timeout**: the seconds every invocation starts with, when known (the
  function's timeout in Lambda).

A job is started only while the time left covers its budget, the lease margin and
:data:`~leaseq.drain.config.FINISH_RESERVE`, so its outcome is recorded before its lease ends.
"""

from __future__ import annotations

from leaseq.base.errors import ConfigurationError
from leaseq.drain.config import WorkerConfig, needed_for
from leaseq.kinds.registry import Registration, Registry


def budget_of(registration: Registration | None, config: WorkerConfig) -> float:
    """The budget of a job of this kind: the kind's timeout, else the worker's."""
    if registration is not None and registration.timeout is not None:
        return registration.timeout
    return config.job_timeout


def fits(time_left: float, budget: float, config: WorkerConfig) -> bool:
    """Whether a run with ``budget`` may start with ``time_left`` seconds left."""
    return time_left >= needed_for(budget, config.lease_margin)


def check_registry(registry: Registry, config: WorkerConfig) -> None:
    """Refuse a registry this worker could not serve.

    * a kind of the worker's ``kinds`` filter without a handler: every job of it the
      worker claimed would die as an unknown kind, so the filter or the handlers module
      is wrong;
    * kinds whose budget no invocation of this worker can fit, only when the worker knows
      what every invocation starts with (``worker_timeout``): such a kind would be
      claimed and given back on every tick, never run. Kinds the worker does not claim
      (outside ``kinds``, or in ``exclude_kinds``) are not its concern: the slow worker's
      long timeouts do not refuse the main worker that leaves them alone.
    """
    if config.kinds is not None:
        unknown = [kind for kind in config.kinds if registry.get(kind) is None]
        if unknown:
            raise ConfigurationError(
                f"{config.name('kinds')} names {', '.join(repr(k) for k in unknown)}, which "
                f"the handlers register no handler for (they register "
                f"{', '.join(repr(k) for k in registry.kinds) or 'none'}): the worker would "
                "claim those jobs and make them dead as unknown kinds. Register a handler "
                f"for each kind of {config.name('kinds')}, or remove it from the list")
    if config.worker_timeout is None:
        return
    unfit = []
    for kind in registry.kinds:
        if not config.claims(kind):
            continue
        registration = registry.get(kind)
        budget = budget_of(registration, config)
        needed = needed_for(budget, config.lease_margin)
        if needed > config.worker_timeout:
            unfit.append(
                f"kind {kind!r} needs {needed:g} s (its timeout {budget:g} s + "
                f"{config.name('lease_margin')} {config.lease_margin:g} s + 1 s to record), "
                f"the worker's invocation leaves {config.worker_timeout:g} s")
    if unfit:
        raise ConfigurationError(
            "; ".join(unfit) + f": raise {config.name('worker_timeout')}, lower the "
            "kind's timeout (registry.handler(kind, timeout=...)), or leave the kind to a "
            f"worker of its own with a longer one ({config.name('exclude_kinds')} here)")
