"""``python -m dlts``: the ``dlts`` command."""

import sys

from dlts.cli import main

sys.exit(main())
