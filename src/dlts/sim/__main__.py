"""``python -m dlts.sim --cluster ... --trace ... --out ...``"""

from dlts.sim.cli import main

main()
