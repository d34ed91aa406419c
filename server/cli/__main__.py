"""`python -m server.cli`: the `laggard` command without the installed script (tests, benches)."""

import sys

from server.cli.main import main

sys.exit(main())
