"""The DLTS init: PID 1 of a job (``python -I -S dlts_init.py [--exit-file F] -- CMD ...``).

It starts CMD in a process group of its own, forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT to that whole
group, reaps every zombie that lands on it (it makes itself a child subreaper), and exits with the
child's code (128 + N when the child died of signal N). Standard library only: it runs as a script
so that it starts in milliseconds. The code is also written atomically to
``--exit-file`` so the job manager learns it even after a restart of its own.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to the real init, which is fine
        pass


def _write_exit(path: str | None, code: int) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{code}\n")
    os.replace(tmp, path)


def _code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run(argv: list[str], exit_file: str | None) -> int:
    _become_subreaper()
    child = os.fork()
    if child == 0:  # the job: its own process group, default signal handling
        os.setpgid(0, 0)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"dlts-init: cannot run {argv[0]}: {exc.strerror}\n")
            os._exit(127)
    try:
        os.setpgid(child, child)
    except OSError:  # the child already did it (or already exec'd)
        pass

    def forward(signum, _frame):
        try:
            os.killpg(child, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            code = _code(status)
            # the job's leader is gone; take the rest of its group down with it
            try:
                os.killpg(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    _write_exit(exit_file, code)
    return code


def main() -> None:
    parser = argparse.ArgumentParser(prog="dlts-init")
    parser.add_argument("--exit-file")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    sys.exit(run(command, args.exit_file))


if __name__ == "__main__":
    main()
