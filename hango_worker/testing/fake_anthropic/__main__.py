"""`python -m hango_worker.testing.fake_anthropic --port P --script FILE`."""

import sys

from hango_worker.testing.fake_anthropic.cli import main

sys.exit(main())
