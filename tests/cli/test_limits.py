"""``leaseq limits``: set, list, remove and sync, and the limits in ``leaseq status`` and
``leaseq jobs show``, as an operator runs them."""

from __future__ import annotations

import uuid

from tests.cli.conftest import Cli
from tests.support.postgres import Conn


def test_set_list_and_remove_a_kinds_limit_and_status_shows_what_it_holds(
        cli: Cli, owner: Conn) -> None:
    done = cli("limits", "set", "kind:report", "--concurrency", "1", "--rate", "10/s", "--json")
    assert done.code == 0, done.err
    assert done.json()["name"] == "kind:report"
    tenant = str(uuid.uuid4())
    ids = []
    for key in ("a", "b"):
        made = cli("enqueue", "--tenant", tenant, "--key", key, "--kind", "report", "--json")
        assert made.code == 0, made.err
        ids.append(made.json()["jobs"][0]["job_id"])
    [row] = cli("limits", "list", "--json").json()["limits"]
    assert (row["name"], row["concurrency"], row["rate_count"], row["in_force"]) == (
        "kind:report", 1, 10, True)
    status = cli("status", "--json").json()
    [limit] = status["limits"]
    assert (limit["bucket"], limit["admitted"], limit["blocked"]) == ("kind:report", 1, 1)
    held = [i for i in ids if owner.execute(
        "select 1 from app.held_jobs where job_id = %s", (i,)).fetchone()]
    shown = cli("jobs", "show", held[0], "--no-color")
    assert shown.code == 0, shown.err
    assert "held by limit kind:report" in shown.out
    assert cli("limits", "remove", "kind:report").code == 0
    # Nothing is held any more; the job admitted before keeps its slot until it ends.
    assert [r["blocked"] for r in cli("status", "--json").json()["limits"]] == [0]
    gone = cli("limits", "remove", "kind:report")
    assert gone.code == 4


def test_a_limit_that_could_never_admit_is_refused_with_a_clear_error(cli: Cli) -> None:
    for args, words in (
            (("--concurrency", "0"), "would never admit a job"),
            (("--concurrency", "-3"), "would never admit a job"),
            (("--rate", "0/s"), "would never start a job"),
            (("--rate", "ten a second"), "is not COUNT/PERIOD"),
            (("--rate", "5/s", "--burst", "6"), "burst must be between 1 and"),
            ((), "--concurrency N, --rate R/PERIOD, or both")):
        refused = cli("limits", "set", "kind:report", *args)
        assert refused.code != 0, args
        assert words in refused.err, (args, refused.err)
    bad_name = cli("limits", "set", "report", "--concurrency", "2")
    assert "is not kind:KIND" in bad_name.err


def test_sync_writes_the_limits_the_handlers_declare_and_an_operators_is_in_force_over_them(
        cli: Cli) -> None:
    synced = cli("limits", "sync", "--handlers", "tests.cli.limit_handlers", "--json")
    assert synced.code == 0, synced.err
    assert {r["name"] for r in synced.json()["limits"]} == {
        "kind:build_report/tenant:*", "kind:call_partner"}
    assert cli("limits", "set", "kind:call_partner", "--rate", "5/s").code == 0
    rows = cli("limits", "list", "--json").json()["limits"]
    in_force = {(r["name"], r["source"]): r["in_force"] for r in rows}
    assert in_force[("kind:call_partner", "operator")] is True
    assert in_force[("kind:call_partner", "code")] is False
    assert in_force[("kind:build_report/tenant:*", "code")] is True
