"""The commands open the queue with their duty's face (``client_for(args, ui, Face)``),
so a command reaches only the calls of its duty, as each Lambda function does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COMMANDS = Path(__file__).resolve().parents[2] / "local" / "leaseq_cli" / "commands"
#: The face each command module opens; enqueue is a producer, the others operate.
FACES = {"enqueue": {"ProducerClient"}, "operate": {"OperatorClient"},
         "views": {"OperatorClient"}, "schedules": {"OperatorClient"}}


def faces_opened(module: str) -> list[str]:
    tree = ast.parse((COMMANDS / f"{module}.py").read_text("utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "client_for"]
    return [ast.unparse(call.args[2]) if len(call.args) > 2 else "<no face>"
            for call in calls]


@pytest.mark.parametrize("module", sorted(FACES))
def test_a_command_opens_the_queue_with_its_duty_face(module: str) -> None:
    opened = faces_opened(module)

    assert opened  # the command does open the queue
    assert set(opened) == FACES[module]


def test_only_the_shared_opener_and_the_local_runs_build_the_all_duties_client() -> None:
    """run.py (drain, demo) holds one connection for several duties and hands each step
    its face."""
    builders = sorted(path.stem for path in COMMANDS.glob("*.py")
                      if "QueueClient(" in path.read_text("utf-8"))

    assert builders == ["_shared", "run"]
