"""Typed errors of the dlts_lustre package; every failure a caller can act on has a class here."""
from __future__ import annotations

from collections.abc import Sequence


class LustreError(Exception):
    """Base class: anything dlts_lustre raises on purpose."""


class LustreCommandError(LustreError):
    """An ``lfs``/``lctl`` invocation failed, timed out or could not be started.

    ``command`` is the full argv, so the message tells the operator exactly what to re-run by hand.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        exit_code: int | None,
        stderr: str = "",
        stdout: str = "",
        timed_out: bool = False,
        reason: str = "",
    ) -> None:
        self.command = tuple(command)
        self.exit_code = exit_code
        self.stderr = stderr
        self.stdout = stdout
        self.timed_out = timed_out
        self.reason = reason
        shown = " ".join(self.command)
        if timed_out:
            detail = reason or "timed out"
        elif exit_code is None:
            detail = reason or "could not be started"
        else:
            detail = f"exited with status {exit_code}"
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        message = f"`{shown}` {detail}"
        if tail:
            message += f": {tail}"
        if "must be run on the MGS" in stderr:
            message += (" (this command must be run on the MGS: give its route, lustre_mgs_command in dlts.yaml "
                        "or $DLTS_LUSTRE_MGS_COMMAND, e.g. 'ssh root@MGS-HOST')")
        super().__init__(message)


class LustreParseError(LustreError):
    """Output of a Lustre tool did not have the expected shape.

    Carries what was being parsed and the offending line so the recorded output can be turned into a
    new fixture.
    """

    def __init__(self, what: str, message: str, *, line: str | None = None, line_no: int | None = None) -> None:
        self.what = what
        self.line = line
        self.line_no = line_no
        where = f" (line {line_no}: {line!r})" if line is not None and line_no is not None else (
            f" ({line!r})" if line is not None else "")
        super().__init__(f"cannot parse {what}: {message}{where}")


class PolicyError(LustreError):
    """The policy file is unreadable or invalid; the message names the offending key."""


class UnsafePlanError(LustreError):
    """``apply`` refused a plan containing unsafe actions (use ``--force`` to run them anyway)."""

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = tuple(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(
            f"refusing to apply: the plan has {len(self.reasons)} unsafe action(s):\n{lines}\n"
            "Review them, then re-run with --force if they are intended.")
