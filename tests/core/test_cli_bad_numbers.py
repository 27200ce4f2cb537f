"""The CLI's numbers go through the same strict parser as the API's: a unicode digit such as "²"
("²".isdigit() is true, int("²") fails) is a message naming the option, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dlts.cli import main


@pytest.fixture
def dlts(settings, monkeypatch):
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DLTS_HOME", str(settings.home))

    def run(*args: str):
        result = CliRunner().invoke(main, list(args))
        return result.exit_code, result.output, result.exception

    return run


@pytest.mark.parametrize("digit", ["²", "١", "-1", "1_0"])
def test_unicode_digits_in_cli_options_name_the_option(dlts, digit):
    code, output, exception = dlts("vc", "set", "research", "--quota", f"a100={digit}")
    assert code != 0 and "quota" in output and "SKU=GPUS" in output, output
    assert exception is None or isinstance(exception, SystemExit)
    code, output, exception = dlts("vc", "set", "research", "--quota", "a100=1", "--gid", digit)
    assert code == 2 and "--gid" in output and "whole number" in output, output
    code, output, exception = dlts("vc", "set", "research", "--quota", "a100=1", "--ephemeral-storage", digit)
    assert code == 2 and "--ephemeral-storage" in output, output
