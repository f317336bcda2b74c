"""Synchronous invocations through boto3: context, warm reuse, deadlines, errors, the API."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from leaseq_lambda_local import LocalLambda

from tests.lambda_local.conftest import (
    TEST_TEMPLATE,
    Start,
    alive,
    client_for,
    payload,
    wait_for,
)


def test_the_context_counts_down_from_the_timeout_and_a_warm_environment_is_reused(
    service: LocalLambda, client: Any,
) -> None:
    first = client.invoke(FunctionName="Probe", Payload=b"{}")
    second = client.invoke(FunctionName="Probe", Payload=json.dumps({"sleep": 0.2}))

    one, two = payload(first), payload(second)
    assert first["StatusCode"] == 200
    assert "FunctionError" not in first
    assert first["ExecutedVersion"] == "$LATEST"
    assert one["request_id"] == first["ResponseMetadata"]["RequestId"]
    assert one["name"] == "Probe"
    assert one["arn"] == "arn:aws:lambda:us-east-1:123456789012:function:Probe"
    assert one["memory"] == "256"  # a string, as the real runtime reads it from the env
    assert one["version"] == "$LATEST"
    assert one["trace"].startswith("Root=1-")
    assert Path(one["task_root"]).name == "probe"
    assert one["marker"] == "from-globals"
    assert 0 < one["remaining_ms"] <= 2000  # the template's Timeout: 2
    assert two["remaining_ms"] <= 2000 - 200  # 0.2 s spent before it asked
    assert (two["pid"], two["calls"]) == (one["pid"], 2)  # same process, init once
    stats = service.service.stats()["functions"]["Probe"]
    assert (stats["invocations"], stats["cold_starts"]) == (2, 1)


def test_the_callers_client_context_reaches_the_handler(client: Any) -> None:
    context = base64.b64encode(json.dumps({"custom": {"tenant": "t-1"}}).encode()).decode()

    answer = client.invoke(FunctionName="Probe", Payload=b"{}", ClientContext=context)

    assert payload(answer)["client_custom"] == {"tenant": "t-1"}


def test_an_invocation_past_its_timeout_is_killed_and_the_next_one_is_a_cold_start(
    service: LocalLambda, client: Any,
) -> None:
    warm = payload(client.invoke(FunctionName="Slow", Payload=b"{}"))
    began = time.monotonic()

    answer = client.invoke(FunctionName="Slow", Payload=json.dumps({"sleep": 30}))
    took = time.monotonic() - began

    error = payload(answer)
    assert answer["StatusCode"] == 200
    assert answer["FunctionError"] == "Unhandled"
    assert error["errorType"] == "Sandbox.Timedout"
    assert "Task timed out after 1.00 seconds" in error["errorMessage"]
    assert answer["ResponseMetadata"]["RequestId"] in error["errorMessage"]
    assert 1.0 <= took < 15.0  # killed at its 1 s deadline, not after the 30 s sleep
    assert not alive(warm["pid"])  # the whole environment went with it
    after = payload(client.invoke(FunctionName="Slow", Payload=b"{}"))
    assert after["pid"] != warm["pid"]
    assert after["calls"] == 1  # a fresh process: init ran again
    stats = service.service.stats()["functions"]["Slow"]
    assert (stats["timeouts"], stats["cold_starts"], stats["invocations"]) == (1, 2, 3)


def test_a_handler_error_comes_back_as_lambda_reports_it_and_the_environment_stays_warm(
    client: Any,
) -> None:
    before = payload(client.invoke(FunctionName="Probe", Payload=b"{}"))

    answer = client.invoke(FunctionName="Probe", Payload=json.dumps({"fail": "card declined"}))

    error = payload(answer)
    assert answer["FunctionError"] == "Unhandled"
    assert error["errorType"] == "ValueError"
    assert error["errorMessage"] == "card declined"
    assert any("app.py" in frame for frame in error["stackTrace"])
    assert payload(client.invoke(FunctionName="Probe", Payload=b"{}"))["pid"] == before["pid"]


def test_an_init_error_fails_the_invocation_and_the_next_invocation_inits_again(
    service: LocalLambda, client: Any,
) -> None:
    answers = [client.invoke(FunctionName="BadInit", Payload=b"{}") for _ in range(2)]

    for answer in answers:
        error = payload(answer)
        assert answer["FunctionError"] == "Unhandled"
        assert error["errorType"] == "RuntimeError"
        assert error["errorMessage"] == "broken at import"
    stats = service.service.stats()["functions"]["BadInit"]
    assert (stats["init_errors"], stats["cold_starts"], stats["warm_environments"]) == (2, 2, 0)


def test_a_synchronous_invoke_beyond_the_reserved_concurrency_is_throttled_with_429(
    service: LocalLambda, client: Any,
) -> None:
    results: list[Any] = []
    busy = threading.Thread(target=lambda: results.append(payload(client_for(service.url).invoke(
        FunctionName="Single", Payload=json.dumps({"sleep": 2})))))
    busy.start()
    try:
        wait_for(lambda: service.service.stats()["functions"]["Single"]
                 ["concurrency_in_use"] == 1, "the first invoke to hold the only slot")

        with pytest.raises(ClientError) as raised:
            client.invoke(FunctionName="Single", Payload=b"{}")
    finally:
        busy.join(timeout=30)

    error = raised.value.response
    assert error["Error"]["Code"] == "TooManyRequestsException"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert error["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"
    assert len(results) == 1
    assert "pid" in results[0]  # the first one was not disturbed
    assert "pid" in payload(client.invoke(FunctionName="Single", Payload=b"{}"))
    stats = service.service.stats()["functions"]["Single"]
    assert (stats["throttles"], stats["peak_concurrency"]) == (1, 1)


@pytest.mark.parametrize("name", [
    "Probe", "Probe:$LATEST", "arn:aws:lambda:us-east-1:123456789012:function:Probe",
    "arn:aws:lambda:us-east-1:123456789012:function:Probe:$LATEST",
    "123456789012:function:Probe",
])
def test_names_arns_and_qualifiers_are_accepted_as_boto3_sends_them(
    client: Any, name: str,
) -> None:
    answer = client.invoke(FunctionName=name, Payload=b"{}")

    assert payload(answer)["name"] == "Probe"


@pytest.mark.parametrize(("arguments", "code"), [
    ({"FunctionName": "NoSuchFunction"}, "ResourceNotFoundException"),
    ({"FunctionName": "Probe", "Qualifier": "live"}, "ResourceNotFoundException"),
    ({"FunctionName": "arn:aws:lambda:eu-west-1:123456789012:function:Probe"},
     "ResourceNotFoundException"),
    ({"FunctionName": "Probe:one", "Qualifier": "two"}, "InvalidParameterValueException"),
    ({"FunctionName": "Probe", "Payload": b"{not json"}, "InvalidRequestContentException"),
    ({"FunctionName": "Probe", "InvocationType": "Event",
      "Payload": b'"' + b"x" * (1024 * 1024) + b'"'}, "RequestTooLargeException"),
])
def test_what_lambda_refuses_is_refused_with_its_modelled_error(
    client: Any, arguments: dict[str, Any], code: str,
) -> None:
    with pytest.raises(ClientError) as raised:
        client.invoke(**{"Payload": b"{}", **arguments})

    assert raised.value.response["Error"]["Code"] == code


def test_a_dry_run_answers_204_and_runs_nothing(service: LocalLambda, client: Any) -> None:
    answer = client.invoke(FunctionName="Probe", InvocationType="DryRun")

    assert answer["StatusCode"] == 204
    assert service.service.stats()["functions"]["Probe"]["invocations"] == 0


def test_boto3_reaches_the_service_through_AWS_ENDPOINT_URL_LAMBDA(
    service: LocalLambda, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", service.url)
    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")

    answer = client.invoke(FunctionName="Probe", Payload=b"{}")

    assert client.meta.endpoint_url == service.url
    assert payload(answer)["name"] == "Probe"


def test_a_function_invokes_another_through_the_invoker_and_reaches_this_service(
    service: LocalLambda, client: Any, tmp_path: Path,
) -> None:
    sync = payload(client.invoke(FunctionName="Caller", Payload=json.dumps(
        {"target": "Probe", "payload": {}})))
    queued = payload(client.invoke(FunctionName="Caller", Payload=json.dumps(
        {"target": "Probe", "type": "Event", "payload": {"record": str(tmp_path)}})))

    assert sync["endpoint"] == service.url  # AWS_ENDPOINT_URL_LAMBDA, set by the service
    assert (sync["status"], sync["payload"]["name"]) == (200, "Probe")
    assert (queued["status"], queued["payload"]) == (202, None)
    wait_for(lambda: service.service.stats()["functions"]["Probe"]["async_succeeded"] == 1,
             "the asynchronous invoke to run")
    assert len(list(tmp_path.glob("*.json"))) == 2  # the synchronous one and this one
    assert service.service.stats()["functions"]["Probe"]["invocations"] == 2


def test_stopping_the_service_kills_busy_and_idle_environments_and_frees_the_port(
    start_service: Start,
) -> None:
    service = start_service(schedules=False)
    client = client_for(service.url)
    idle = payload(client.invoke(FunctionName="Probe", Payload=b"{}"))["pid"]
    slow = threading.Thread(target=lambda: _quietly(client_for(service.url), "Limited"))
    slow.start()
    wait_for(lambda: service.service.stats()["functions"]["Limited"]["environments"],
             "the busy environment")
    busy = service.service.stats()["functions"]["Limited"]["environments"][0]["pid"]
    port = int(service.url.rsplit(":", 1)[1])

    began = time.monotonic()
    service.close()
    slow.join(timeout=30)

    assert time.monotonic() - began < 20  # it did not wait for the 8 s sleep to end
    assert not alive(idle)
    assert busy is None or not alive(busy)
    with pytest.raises(ConnectionRefusedError), \
            socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def _quietly(client: Any, function: str) -> None:
    try:
        client.invoke(FunctionName=function, Payload=json.dumps({"sleep": 8}))
    except Exception:  # the service went away mid-call, which is the point
        return


def test_a_service_killed_outright_leaves_no_runtime_process_behind() -> None:
    script = textwrap.dedent(f"""
        import json, time, boto3
        from pathlib import Path
        from leaseq_lambda_local import LocalConfig, LocalLambda, LogWriter
        service = LocalLambda(LocalConfig(template=Path({str(TEST_TEMPLATE)!r}), port=0,
                                          schedules=False, log=LogWriter(None))).start()
        client = boto3.client("lambda", endpoint_url=service.url, region_name="us-east-1",
                              aws_access_key_id="t", aws_secret_access_key="t")
        answer = client.invoke(FunctionName="Probe", Payload=b"{{}}")
        print(json.loads(answer["Payload"].read())["pid"], flush=True)
        time.sleep(60)
    """)
    service = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert service.stdout is not None
        pid = int(service.stdout.readline())
        assert alive(pid)  # warm, and frozen: it would never notice the service is gone

        service.kill()  # SIGKILL: no close(), no cleanup in the service
        service.wait(timeout=10)

        wait_for(lambda: not alive(pid), "the watchdog to kill the orphaned environment")
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(timeout=10)
