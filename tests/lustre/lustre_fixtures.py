"""Loader for the recorded outputs in fixtures/ (importable by test modules; conftest uses it too)."""
from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(name: str) -> str:
    """A recorded output without its provenance header.

    Fixture files start with ``#`` lines saying where the output came from (a capture, or built from the
    documented format); the parsers never see them.
    """
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


# How the tests reach the fake's MGS node (production: ssh to the MGS; docs/lustre.md).
MGS_PREFIX = "env DLTS_FAKE_LUSTRE_NODE=mgs"
