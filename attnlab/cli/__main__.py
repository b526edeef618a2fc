"""`python -m attnlab.cli ...` (what torchrun and the tests run)."""

import sys

from attnlab.cli.main import main

sys.exit(main())
