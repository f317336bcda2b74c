"""The failure suite's shared fixtures: the local Lambda service of tests/lambda_local,
for the elastic drain's failure tests."""

from tests.lambda_local.conftest import start_service

__all__ = ["start_service"]
