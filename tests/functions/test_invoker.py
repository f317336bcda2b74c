"""leaseq_lambda.invoker: one Lambda client per execution environment, wherever boto3's
own endpoint configuration points it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from leaseq_lambda import invoker


@pytest.fixture(autouse=True)
def _fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_LAMBDA",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    invoker.reset()
    yield
    invoker.reset()


def test_the_client_goes_where_AWS_ENDPOINT_URL_LAMBDA_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", "http://127.0.0.1:3001")

    assert invoker.lambda_client().meta.endpoint_url == "http://127.0.0.1:3001"


def test_without_endpoint_configuration_the_client_goes_to_aws_lambda() -> None:
    assert invoker.lambda_client().meta.endpoint_url == "https://lambda.us-east-1.amazonaws.com"


def test_the_client_is_built_once_per_environment_and_outlasts_a_synchronous_invoke() -> None:
    first = invoker.lambda_client()

    assert invoker.lambda_client() is first
    assert first.meta.config.read_timeout > 900  # the longest Lambda timeout
    invoker.reset()
    assert invoker.lambda_client() is not first
