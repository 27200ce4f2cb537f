"""``dlts sim``: replay a job trace through the real scheduler core in simulated time.

``inputs`` reads CLUSTER.yaml and TRACE.csv, ``engine`` runs the discrete-event loop and builds
RESULT.json, ``verify`` re-checks the scheduling rules on a RESULT alone, ``cli`` is the command.
"""
