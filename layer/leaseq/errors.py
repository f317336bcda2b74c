"""One exception tree for the whole library.

Every message says what happened and what to do about it. Errors that come from
PostgreSQL keep their SQLSTATE in ``.sqlstate`` so callers can branch on the contract
documented in ``sql/README.md`` instead of on message text.
"""

from __future__ import annotations


class LeaseqError(Exception):
    """Base of every error leaseq raises."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


class ConfigurationError(LeaseqError):
    """Settings, secrets or handler registrations are missing or invalid."""


class TlsVerificationError(ConfigurationError):
    """The server's TLS certificate failed a check (its CA or its host name).

    A configuration error, not an unavailable server: retrying cannot help until the
    trusted roots, the host name or the server's certificate change.
    """


class InvalidRequestError(LeaseqError):
    """The input broke the contract (SQLSTATE 22023, 23514, 22P02, 22P05 or 22001)."""


class IdempotencyConflictError(InvalidRequestError):
    """The operation key already names a job with a different kind or payload (23505)."""


class JobNotFoundError(LeaseqError):
    """No job has that id (for this tenant)."""


class LeaseLostError(LeaseqError):
    """The lease fence refused a stale owner/token; raised only when a caller asks."""


class SchemaVersionError(LeaseqError):
    """The database schema and this library's migrations disagree."""


class DatabaseError(LeaseqError):
    """Any other PostgreSQL failure, wrapped with its SQLSTATE."""


class DatabaseUnavailableError(DatabaseError):
    """The server could not be reached or went away: safe to retry later."""


class PermissionDeniedError(DatabaseError):
    """The connected role lacks a privilege (42501); retrying will not help."""


class MigrationBlockedError(DatabaseError):
    """A migration could not take its table locks in time (55P03) and was not applied.

    Raised by :func:`leaseq.migrate.migrate` after its retries, instead of waiting for
    ever behind a long transaction while every claim waits behind the migration.
    """


#: SQLSTATE (or class prefix) -> error type. The longest matching prefix wins.
SQLSTATE_ERRORS: dict[str, type[LeaseqError]] = {
    "22023": InvalidRequestError,
    "23514": InvalidRequestError,
    "22P02": InvalidRequestError,
    "22P05": InvalidRequestError,
    "22001": InvalidRequestError,
    "22021": InvalidRequestError,
    "23505": IdempotencyConflictError,
    "42501": PermissionDeniedError,
    "08": DatabaseUnavailableError,
    "57P01": DatabaseUnavailableError,
    "57P02": DatabaseUnavailableError,
    "57P03": DatabaseUnavailableError,
    "53300": DatabaseUnavailableError,
}


def error_type_for(sqlstate: str | None) -> type[LeaseqError]:
    """Map a SQLSTATE to the library's exception type (DatabaseError by default)."""
    if sqlstate is None:
        return DatabaseUnavailableError
    for length in (5, 2):
        found = SQLSTATE_ERRORS.get(sqlstate[:length])
        if found is not None:
            return found
    return DatabaseError
