"""dlts_agent: the DLTS node agent (metrics exporter, GPU/node health detectors, repair actions).

See docs/agent.md. Nothing happens at import time beyond reading the installed version.
"""

from __future__ import annotations

import os
import sys


def _installed_version(dist: str = "dlts") -> str:
    """The distribution's version from its metadata file on sys.path.

    This is what importlib.metadata.version() reads; doing it directly saves the agent about
    0.9 MiB of resident memory (email, zipfile, csv, pathlib machinery) on every node.
    """
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith(f"{dist}-") and name.endswith(".dist-info"):
                path = os.path.join(entry, name, "METADATA")
            elif name == f"{dist}.egg-info":
                path = os.path.join(entry, name, "PKG-INFO")
            else:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break  # end of the header block
            except OSError:
                continue
    return "0.0.0+unknown"


__version__ = _installed_version()
