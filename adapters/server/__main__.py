"""``python -m shmbus.adapters.server module:app``: see :func:`.cli.main`."""

import sys

from .cli import main

sys.exit(main())
