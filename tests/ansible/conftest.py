"""Fixtures of the Ansible tests (helpers live in ansible_helpers.py, the VM in dlts_vm.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ansible_helpers import INVENTORIES


@pytest.fixture(params=sorted(INVENTORIES))
def inventory_name(request) -> str:
    return request.param
