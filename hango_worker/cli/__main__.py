"""`python -m hango_worker.cli …`: the same as the `hango-worker` command."""

import sys

from hango_worker.cli import main

sys.exit(main())
