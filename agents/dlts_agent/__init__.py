"""dlts_agent: the DLTS node agent (metrics exporter, GPU/node health detectors, repair actions).

See docs/agent.md. Nothing happens at import time.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dlts")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
