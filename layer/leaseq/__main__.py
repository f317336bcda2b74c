"""``python -m leaseq``: the same command line as the ``leaseq`` console script."""

import sys

from leaseq_cli.main import main

sys.exit(main())
