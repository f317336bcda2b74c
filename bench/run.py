#!/usr/bin/env python3
"""Run the queue throughput benchmark: ``python3 bench/run.py --help``; the elastic
benchmark (fan-out and wake on the local Lambda service): ``python3 bench/run.py elastic``.

The first run builds ``bench/.venv`` (leaseq from this checkout, the peers from PyPI)
and every later step runs inside it, so the benchmark never touches the project's own
environment. See docs/benchmarks.md for what is measured and how to read the output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import venv

if __name__ == "__main__":
    venv.ensure_and_reexec(sys.argv[1:])
    from harness.main import main

    sys.exit(main(sys.argv[1:]))
