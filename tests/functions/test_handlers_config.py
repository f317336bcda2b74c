"""leaseq_lambda.handlers_environment: the stack's HandlersEnvironment, read by handlers."""

from __future__ import annotations

import pytest
from leaseq import ConfigurationError
from leaseq_lambda import handlers_environment
from leaseq_lambda.handlers_config import ENVIRONMENT_VARIABLE


def test_the_json_object_of_strings_is_the_handlers_settings() -> None:
    settings = handlers_environment({ENVIRONMENT_VARIABLE: '{"BUCKET": "invoices", "N": "3"}'})

    assert settings == {"BUCKET": "invoices", "N": "3"}


@pytest.mark.parametrize("value", [None, "", "  ", "{}"])
def test_unset_or_empty_is_no_settings(value: str | None) -> None:
    environ = {} if value is None else {ENVIRONMENT_VARIABLE: value}

    assert handlers_environment(environ) == {}


@pytest.mark.parametrize(("value", "problem"), [
    ("{BUCKET: x}", "is not JSON"),
    ('["a"]', "must be a JSON object of strings"),
    ('{"N": 3}', "must be a JSON object of strings"),
    ('{"N": {"deep": "x"}}', "must be a JSON object of strings"),
])
def test_anything_else_is_a_configuration_error_naming_the_parameter(
    value: str, problem: str,
) -> None:
    with pytest.raises(ConfigurationError, match=problem) as raised:
        handlers_environment({ENVIRONMENT_VARIABLE: value})

    assert "HandlersEnvironment" in raised.value.message


def test_it_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, '{"REGION": "eu-west-1"}')

    assert handlers_environment() == {"REGION": "eu-west-1"}
