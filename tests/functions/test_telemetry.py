"""The library's stdlib log lines come out once, as Powertools JSON, whatever the
service is called, even when one process builds loggers for several services (the
local CLI and the tests do)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from leaseq_lambda import telemetry


def library_lines(capsys: pytest.CaptureFixture[str], text: str) -> list[dict[str, Any]]:
    logging.getLogger("leaseq.worker").warning(text, extra={"job_id": "j-1"})
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    return [line for line in lines if line["message"] == text]


def test_library_lines_go_out_once_through_the_services_handler_under_any_name(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for service in ("orders", "leaseq", "billing", "leaseq"):
        monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", service)
        telemetry.make_logger()
        (line,) = library_lines(capsys, f"under {service}")
        assert line["job_id"] == "j-1"
        assert line["level"] == "WARNING"
        assert line["service"] in {service, "leaseq"}


def test_metrics_default_to_the_contracts_namespace_and_service(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_NAMESPACE", raising=False)
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    metrics = telemetry.make_metrics()
    metrics.add_metric(name="JobsClaimed", unit="Count", value=1)
    document = metrics.serialize_metric_set()
    metrics.clear_metrics()
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Leaseq"
    assert directive["Dimensions"] == [["service"]]
    assert document["service"] == "leaseq"
