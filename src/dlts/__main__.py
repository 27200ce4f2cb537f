"""``python -m dlts``: the ``dlts`` command (shell completion uses ``_DLTS_COMPLETE`` either way)."""

import sys

from dlts.cli import main

sys.exit(main(prog_name="dlts"))
