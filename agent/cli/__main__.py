"""`python -m agent.cli ...` is `pkb ...`."""

import sys

from agent.cli import main

sys.exit(main())
