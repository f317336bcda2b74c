"""One exception tree for the whole library.

Every message says what happened and what to do about it. Errors that come from
PostgreSQL keep their SQLSTATE in ``.sqlstate`` so callers can branch on the contract
documented in ``sql/README.md`` instead of on message text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import ValidationError

    from leaseq.base.results import JobResult


class LeaseqError(Exception):
    """Base of every error leaseq raises."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


class ConfigurationError(LeaseqError):
    """Settings, secrets or handler registrations are missing or invalid: raised before
    any job runs (at registration, when a worker is built, at cold start), so that a
    wrong setting fails loudly instead of losing jobs.

    >>> from leaseq import Registry
    >>> Registry().register("", lambda payload, ctx: None)
    Traceback (most recent call last):
    ...
    leaseq.base.errors.ConfigurationError: job kind '' is invalid: use 1 to 128 characters, ...
    """


class TlsVerificationError(ConfigurationError):
    """The server's TLS certificate failed a check (its CA or its host name).

    A configuration error, not an unavailable server: retrying cannot help until the
    trusted roots, the host name or the server's certificate change.
    """


class InvalidRequestError(LeaseqError):
    """The input broke the contract (SQLSTATE 22023, 23514, or another data exception
    about a value sent), or a value could not be sent at all (no SQLSTATE); retrying the
    same input will not help."""


class UnknownKindError(InvalidRequestError):
    """A job's kind has no handler in the registry a door checks jobs against (the
    enqueue function with LEASEQ_ENQUEUE_HANDLERS, ``leaseq enqueue --handlers``): a worker
    would record it dead, so it is refused before anything is stored."""

    def __init__(self, kind: str, known: list[str]) -> None:
        shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20
                                         else "")
        super().__init__(f"unknown kind {kind!r}: the handlers register {shown}; enqueue one "
                         "of these kinds, or deploy the handler for this one first")
        self.kind = kind


class PayloadRejectedError(InvalidRequestError):
    """A job's payload does not fit its kind's payload model: the worker would record the
    job dead at once, so it is refused before anything is stored. ``errors`` holds the
    model's errors field by field (``(field, pydantic error type, message)``, fields
    under ``payload``), without the input."""

    def __init__(self, kind: str, exc: ValidationError) -> None:
        self.errors: tuple[tuple[str, str, str], ...] = tuple(
            ("payload" + "".join(f".{part}" for part in error["loc"]), error["type"],
             error["msg"])
            for error in exc.errors(include_url=False, include_input=False))
        super().__init__(f"the payload does not fit the model of kind {kind!r} "
                         f"({exc.title}): " + "; ".join(f"{field}: {message}"
                                                         for field, _, message in self.errors))
        self.kind = kind


class IdempotencyConflictError(InvalidRequestError):
    """The operation key already names a job with a different kind or payload (23505)."""


class ResultTimeoutError(LeaseqError):
    """A producer waited for a job to finish, and it had not when the wait ended; ``job``
    is how it was then. Ending the wait does nothing to the job."""

    def __init__(self, job: JobResult, waited: float) -> None:
        super().__init__(
            f"job {job.id} of tenant {job.tenant_id} was still {job.state.value} (attempt "
            f"{job.attempts} of {job.max_attempts}) when the wait of {waited:g} s ended; "
            "the job goes on: read or wait for its result again later, or wait longer")
        self.job = job


class SchemaVersionError(LeaseqError):
    """The database schema and this library's migrations disagree."""


class DatabaseError(LeaseqError):
    """Any other PostgreSQL failure, wrapped with its SQLSTATE; or a client-side failure
    that retrying would not fix: a connection the application closed, a call made wrong,
    a result Python cannot represent."""


class DatabaseUnavailableError(DatabaseError):
    """The server could not be reached, refused the login, or went away: the one failure
    worth retrying, later or on a new connection."""


class PermissionDeniedError(DatabaseError):
    """The connected role lacks a privilege (42501); retrying will not help."""


class MigrationBlockedError(DatabaseError):
    """A migration could not take its table locks in time (55P03) and was not applied.

    Raised by :func:`leaseq.store.migrate.migrate` after its retries, instead of waiting for
    ever behind a long transaction while every claim waits behind the migration.
    """


#: SQLSTATE (or class prefix) -> error type. The longest matching prefix wins.
SQLSTATE_ERRORS: dict[str, type[LeaseqError]] = {
    # Data exceptions about a value sent: the contract's checks (22023), malformed
    # input (22P02), a NUL escape (22P05), too long (22001), invalid encoding (22021),
    # out of its type's range (22003), a time PostgreSQL cannot read (22007, 22008) or
    # a UTC offset beyond +-15:59 (22009). The rest of class 22 (division by zero...)
    # is a fault of the SQL, not of the input: DatabaseError.
    "22023": InvalidRequestError,
    "22P02": InvalidRequestError,
    "22P05": InvalidRequestError,
    "22001": InvalidRequestError,
    "22021": InvalidRequestError,
    "22003": InvalidRequestError,
    "22007": InvalidRequestError,
    "22008": InvalidRequestError,
    "22009": InvalidRequestError,
    "23514": InvalidRequestError,
    "23505": IdempotencyConflictError,
    "42501": PermissionDeniedError,
    "08": DatabaseUnavailableError,
    "57P01": DatabaseUnavailableError,
    "57P02": DatabaseUnavailableError,
    "57P03": DatabaseUnavailableError,
    "53300": DatabaseUnavailableError,
}

#: What failed in the client, for an error that carries no SQLSTATE.
ClientFailure = Literal[
    "connection_failed", "closed_connection", "unsendable_value", "undecodable_value",
    "client_misuse",
]

#: Client-side failure -> error type. Only a failed connection (refused, lost, timed
#: out, a login refused) is retryable; the rest would fail the same way again.
CLIENT_ERRORS: dict[ClientFailure, type[LeaseqError]] = {
    # psycopg.OperationalError without a SQLSTATE.
    "connection_failed": DatabaseUnavailableError,
    # The same error on a connection the application closed itself.
    "closed_connection": DatabaseError,
    # psycopg.DataError, ValueError, TypeError while adapting a parameter: NUL in text,
    # a lone surrogate, json.dumps of a set or of an integer over Python's digit limit.
    "unsendable_value": InvalidRequestError,
    # The same errors while loading a result: a value Python cannot represent.
    "undecodable_value": DatabaseError,
    # psycopg.ProgrammingError, InterfaceError, NotSupportedError...: a call made wrong.
    "client_misuse": DatabaseError,
}


def error_type_for(sqlstate: str | None) -> type[LeaseqError]:
    """Map a SQLSTATE to the library's exception type (DatabaseError by default).

    Without a SQLSTATE the answer is DatabaseError, never the retryable
    DatabaseUnavailableError: use :func:`client_error_type` when what failed is known.
    """
    if sqlstate is None:
        return DatabaseError
    for length in (5, 2):
        found = SQLSTATE_ERRORS.get(sqlstate[:length])
        if found is not None:
            return found
    return DatabaseError


def client_error_type(failure: ClientFailure) -> type[LeaseqError]:
    """The library's exception type for a client-side failure (see CLIENT_ERRORS)."""
    return CLIENT_ERRORS[failure]


def field_path(error: Mapping[str, Any], whole: str = "input") -> str:
    """Where one of pydantic's errors is, dotted (``jobs.3.kind``); ``whole`` for an
    error about the whole value."""
    return ".".join(str(part) for part in error["loc"]) or whole


def one_line(exc: ValidationError, whole: str = "input") -> str:
    """Pydantic's errors as one line, ``field: problem; other.field: problem``: the form
    of every validation message leaseq writes (settings, events, command-line input), so
    that a log line or an error message names each bad field once. Inputs are left out,
    so a message never echoes a secret or a payload back.

    >>> from pydantic import BaseModel, Field, ValidationError
    >>> class Batch(BaseModel):
    ...     size: int = Field(ge=1)
    >>> try:
    ...     Batch(size=0)
    ... except ValidationError as exc:
    ...     print(one_line(exc))
    size: Input should be greater than or equal to 1
    """
    return "; ".join(f"{field_path(error, whole)}: {error['msg']}" for error in exc.errors())
