"""The Lambda client a function uses to invoke another function (fan-out, wake-up).

One ``boto3.client("lambda")`` per execution environment, built on first use and kept
while the environment is warm (a client is costly to build and safe to reuse). It is
built without an ``endpoint_url`` on purpose: boto3's own endpoint configuration
decides where it goes, so the same code reaches

* AWS Lambda when nothing is configured (in AWS);
* any Invoke-API-compatible service named by ``AWS_ENDPOINT_URL_LAMBDA`` (or
  ``AWS_ENDPOINT_URL``, or ``endpoint_url`` in the AWS config file): the local Lambda
  service sets it for the functions it runs, ``sam local start-lambda`` users set it by
  hand. Service-specific endpoint variables arrived in botocore in 2023 (the project's
  boto3>=1.34 has them; tests/functions/test_invoker.py checks the installed one).

The read timeout is raised above botocore's 60 s so that a synchronous invoke of a
function with a longer timeout is not cut off by the caller's client.
"""

from __future__ import annotations

import threading
from typing import Any

#: Longest Lambda timeout (900 s) plus a margin: a RequestResponse invoke can take that long.
READ_TIMEOUT_SECONDS = 910
CONNECT_TIMEOUT_SECONDS = 10

_client: Any = None
_lock = threading.Lock()


def lambda_client() -> Any:
    """The execution environment's Lambda client (built on first call, then reused)."""
    global _client
    with _lock:
        if _client is None:
            import boto3
            from botocore.config import Config

            _client = boto3.client("lambda", config=Config(
                read_timeout=READ_TIMEOUT_SECONDS, connect_timeout=CONNECT_TIMEOUT_SECONDS))
        return _client


def reset() -> None:
    """Forget the cached client; the next call builds a new one (for tests)."""
    global _client
    with _lock:
        _client = None
