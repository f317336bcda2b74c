"""leaseq demo --queues: two named queues drained in parallel by their own workers while a
third stays paused with every job it was given."""

from __future__ import annotations

from tests.cli.conftest import Cli


def test_the_queues_demo_drains_two_queues_in_parallel_and_leaves_the_paused_one(
        cli: Cli) -> None:
    result = cli("demo", "--queues", "--jobs", "20", "--json")
    assert result.code == 0, result.err
    summary = result.json()
    assert summary["finished"] == {"demo-emails": 20, "demo-images": 20, "demo-bulk": 0}
    assert summary["waiting"]["demo-bulk"] == 20
    # Both drained queues had jobs running at once in some sample: in parallel.
    assert any(s["queues"]["demo-emails"][1] and s["queues"]["demo-images"][1]
               for s in summary["samples"])
    assert all(s["queues"]["demo-bulk"][1] == 0 for s in summary["samples"])
