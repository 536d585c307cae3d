"""``python -m tidemq.cli``: the ``tidemq`` command without its console script."""

import sys

from tidemq.cli import main

sys.exit(main())
