"""The only code that runs ``lfs`` and ``lctl``.

Runs them through the ``sh`` package with a timeout and a set of accepted exit codes, turns every
failure into a ``LustreCommandError`` naming the command, and in dry-run mode records mutating
commands instead of running them (read-only commands still run, so a plan can be computed).
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import sh

from dlts_lustre.errors import LustreCommandError

log = logging.getLogger(__name__)

TOOLS = frozenset({"lfs", "lctl"})
DEFAULT_TIMEOUT_S = 60.0
EXECUTED_KEPT = 1000
# lctl subcommands that only work on the MGS (lctl asks the local MGS device; elsewhere it prints
# "This command must be run on the MGS." and exits with ENODEV).
MGS_SUBCOMMANDS = frozenset({"pool_new", "pool_add", "pool_remove", "pool_destroy", "conf_param"})
MGS_COMMAND_ENV = "DLTS_LUSTRE_MGS_COMMAND"


def needs_mgs(argv: Sequence[str]) -> bool:
    """Whether ``argv`` must run on the MGS (pool changes, ``conf_param``, ``set_param -P``)."""
    if len(argv) < 2 or argv[0] != "lctl":
        return False
    return argv[1] in MGS_SUBCOMMANDS or (argv[1] == "set_param" and "-P" in argv[2:])


def mgs_command_from_env() -> tuple[str, ...]:
    return tuple(shlex.split(os.environ.get(MGS_COMMAND_ENV, "")))


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    dry_run: bool = False


@dataclass
class Runner:
    """Runs Lustre tools. ``dry_run`` records (and does not run) commands marked ``mutating``.

    ``mgs_command`` is the argv prefix that reaches the MGS (for example ``ssh -o BatchMode=yes
    root@mds1``): commands that only work there (``needs_mgs``) run as ``PREFIX lctl ...``. Empty
    (the default, or ``$DLTS_LUSTRE_MGS_COMMAND`` when set) runs them here, which is right only on the
    MGS itself.
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    dry_run: bool = False
    mgs_command: tuple[str, ...] = field(default_factory=mgs_command_from_env)
    recorded: list[tuple[str, ...]] = field(default_factory=list)
    # The last commands run, for logs and tests; bounded because the agent's collector lives for months.
    executed: deque[tuple[str, ...]] = field(default_factory=lambda: deque(maxlen=EXECUTED_KEPT))
    call_count: int = 0

    def run(self, argv: Sequence[str], *, mutating: bool = False, ok_codes: Sequence[int] = (0,),
            timeout_s: float | None = None) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        if not argv or argv[0] not in TOOLS:
            raise ValueError(f"Runner only runs {sorted(TOOLS)}, not {argv[:1]}")
        if mutating and self.dry_run:
            self.recorded.append(argv)
            log.info("dry-run: would run %s", " ".join(argv))
            return CommandResult(argv, 0, "", "", dry_run=True)
        # Resolve on every call: PATH may change (tests, modules loaded by the operator).
        prefix = tuple(self.mgs_command) if needs_mgs(argv) else ()
        program = prefix[0] if prefix else argv[0]
        path = shutil.which(program)
        if path is None:
            hint = ("the MGS command (lustre_mgs_command)" if prefix
                    else "install the Lustre client utilities")
            raise LustreCommandError(argv, exit_code=None, reason=f"{program} not found on PATH; {hint}")
        call_args = (*prefix[1:], *argv) if prefix else argv[1:]
        limit_s = self.timeout_s if timeout_s is None else timeout_s
        log.debug("running %s", " ".join(argv))
        # The deadline is a Timer that kills the child: sh's own _timeout polls every 0.1 s, which
        # would add 0.1 s to each of the dozens of short lfs calls an apply makes.
        expired = threading.Event()
        try:
            proc = sh.Command(path)(*call_args, _bg=True, _bg_exc=False, _ok_code=list(ok_codes),
                                    _tty_out=False, _in="")
        except OSError as exc:
            raise LustreCommandError(argv, exit_code=None, reason=str(exc)) from None

        def expire() -> None:
            expired.set()
            try:
                proc.kill()
            except (OSError, sh.SignalException):  # already gone
                pass

        timer = threading.Timer(limit_s, expire)
        timer.daemon = True
        timer.start()
        try:
            proc.wait()
        except sh.ErrorReturnCode as exc:
            if expired.is_set():
                raise LustreCommandError(argv, exit_code=None, timed_out=True, stderr=_text(exc.stderr),
                                         reason=f"timed out after {limit_s:g} s") from None
            raise LustreCommandError(argv, exit_code=exc.exit_code, stderr=_text(exc.stderr),
                                     stdout=_text(exc.stdout)) from None
        finally:
            timer.cancel()
        if expired.is_set():  # killed right as it finished
            raise LustreCommandError(argv, exit_code=None, timed_out=True, reason=f"timed out after {limit_s:g} s")
        self.executed.append(argv)
        self.call_count += 1
        return CommandResult(argv, int(proc.exit_code or 0), _text(proc.stdout), _text(proc.stderr))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data
