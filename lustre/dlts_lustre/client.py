"""Typed Lustre operations. Reads run through the ``Runner`` and parse the answer into a frozen
dataclass (``LustreClient``'s methods); writes are argvs built by the ``cmd_*`` functions, which the
planner puts into a plan's actions and ``LustreClient.execute`` runs (dry-run aware).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from dlts_lustre.errors import LustreCommandError, LustreError
from dlts_lustre.model import (
    GRACE_NOTIFY_S,
    DefaultQuota,
    DfReport,
    DirStripe,
    GraceTimes,
    Health,
    LustreVersion,
    Pool,
    ProjectInfo,
    QuotaKind,
    QuotaLimits,
    QuotaReport,
    ServerTarget,
    StatsBlock,
    StripeLayout,
)
from dlts_lustre.parsers import (
    parse_default_quota,
    parse_df_single,
    parse_getdirstripe,
    parse_getdirstripe_mdt,
    parse_getstripe,
    parse_grace_times,
    parse_health,
    parse_pool_list,
    parse_pool_members,
    parse_project,
    parse_quota,
    parse_stats,
    parse_version,
)
from dlts_lustre.parsers._common import decode_target
from dlts_lustre.parsers.params import osd_values, parse_params
from dlts_lustre.runner import CommandResult, Runner

Argv = tuple[str, ...]
OST_STATS_PARAM = "obdfilter.*.stats"
MDT_STATS_PARAM = "mdt.*.md_stats"
# the per-target space of a server, without a client mount (lfs df needs one)
SERVER_SPACE_PARAMS = ("kbytestotal", "kbytesfree", "kbytesavail", "filestotal", "filesfree")
QUOTA_SLAVE_ENABLED = "quota_slave*.enabled"


def ost_name(fsname: str, index: int) -> str:
    return f"{fsname}-OST{index:04x}"


# --- command builders (pure) -------------------------------------------------------------------------

def cmd_setquota(kind: QuotaKind, ident: str, mount: str, limits: QuotaLimits, pool: str | None = None) -> Argv:
    argv = ["lfs", "setquota", f"-{kind.value}", str(ident)]
    if pool:
        argv += ["--pool", pool]
    argv += ["-b", str(limits.block_soft_kib), "-B", str(limits.block_hard_kib),
             "-i", str(limits.inode_soft), "-I", str(limits.inode_hard), mount]
    return tuple(argv)


def cmd_set_default_quota(kind: QuotaKind, mount: str, limits: QuotaLimits) -> Argv:
    return ("lfs", "setquota", kind.default_flag, "-b", str(limits.block_soft_kib), "-B",
            str(limits.block_hard_kib), "-i", str(limits.inode_soft), "-I", str(limits.inode_hard), mount)


def cmd_use_default_quota(kind: QuotaKind, ident: str, mount: str) -> Argv:
    return ("lfs", "setquota", f"-{kind.value}", str(ident), "--default", mount)


def _grace_arg(seconds: int) -> str:
    return "notify" if seconds == GRACE_NOTIFY_S else str(seconds)


def cmd_set_grace(kind: QuotaKind, mount: str, block_grace_s: int, inode_grace_s: int,
                  pool: str | None = None) -> Argv:
    argv = ["lfs", "setquota", "-t", f"-{kind.value}"]
    if pool:
        argv += ["--pool", pool]
    argv += ["-b", _grace_arg(block_grace_s), "-i", _grace_arg(inode_grace_s), mount]
    return tuple(argv)


def cmd_pool_new(fsname: str, pool: str) -> Argv:
    return ("lctl", "pool_new", f"{fsname}.{pool}")


def cmd_pool_add(fsname: str, pool: str, indices: Iterable[int]) -> Argv:
    return ("lctl", "pool_add", f"{fsname}.{pool}", *(ost_name(fsname, i) for i in sorted(indices)))


def cmd_pool_remove(fsname: str, pool: str, indices: Iterable[int]) -> Argv:
    return ("lctl", "pool_remove", f"{fsname}.{pool}", *(ost_name(fsname, i) for i in sorted(indices)))


def cmd_pool_destroy(fsname: str, pool: str) -> Argv:
    return ("lctl", "pool_destroy", f"{fsname}.{pool}")


def cmd_setstripe(path: str, *, pool: str | None = None, stripe_count: int | None = None,
                  stripe_size: str | None = None) -> Argv:
    argv = ["lfs", "setstripe"]
    if pool:
        argv += ["--pool", pool]
    if stripe_count is not None:
        argv += ["-c", str(stripe_count)]
    if stripe_size is not None:
        argv += ["-S", stripe_size]
    return tuple(argv + [path])


def cmd_mkdir(path: str, *, mdt_index: int | None = None, stripe_count: int | None = None,
              hash_type: str | None = None) -> Argv:
    argv = ["lfs", "mkdir"]
    if stripe_count is not None:
        argv += ["-c", str(stripe_count)]
    if mdt_index is not None:
        argv += ["-i", str(mdt_index)]
    if hash_type is not None:
        argv += ["-H", hash_type]
    return tuple(argv + [path])


def cmd_setdirstripe_default(path: str, *, stripe_count: int = 1, mdt_index: int = -1) -> Argv:
    return ("lfs", "setdirstripe", "-D", "-c", str(stripe_count), "-i", str(mdt_index), path)


def cmd_set_project(path: str, project_id: int) -> Argv:
    return ("lfs", "project", "-p", str(project_id), "-s", "-r", path)


# --- client ------------------------------------------------------------------------------------------

class LustreClient:
    """Typed operations over one ``Runner``. The tool version is detected once (``lfs --version``)."""

    def __init__(self, runner: Runner | None = None, *, version: LustreVersion | None = None) -> None:
        self.runner = runner or Runner()
        self._version = version

    # version
    def version(self) -> LustreVersion:
        if self._version is None:
            self._version = parse_version(self.runner.run(("lfs", "--version")).stdout)
        return self._version

    def _read(self, argv: Sequence[str], ok_codes: Sequence[int] = (0,)) -> CommandResult:
        return self.runner.run(argv, ok_codes=ok_codes)

    def execute(self, argv: Sequence[str]) -> CommandResult:
        """Run a mutating argv built by a ``cmd_*`` function (honours dry-run): the one way this
        package changes a filesystem, so that a plan shows exactly what apply runs."""
        return self.runner.run(argv, mutating=True)

    # quotas
    def quota(self, kind: QuotaKind, ident: str | int, mount: str, *, verbose: bool = False,
              pool: str | None = None, delimited: bool = False, quiet: bool = False) -> QuotaReport:
        """``lfs quota``. ``delimited`` asks for ``-q --delimiter=,`` (2.16.52+ only); it drops the
        lines that say whether an ID follows the defaults, so ``apply`` keeps the headered form."""
        argv = ["lfs", "quota", f"-{kind.value}", str(ident)]
        if delimited:
            if not self.version().new_quota_header:
                raise LustreError(f"lfs quota --delimiter needs Lustre 2.16.52+, this is {self.version()}")
            argv[2:2] = ["-q", "--delimiter=,"]
        elif quiet:
            argv.insert(2, "-q")
        if verbose:
            argv.insert(2, "-v")
        if pool:
            argv += ["--pool", pool]
        argv.append(mount)
        return parse_quota(self._read(argv).stdout, kind=kind, delimiter="," if delimited else None,
                           quiet=quiet and not delimited)

    def _require_defaults(self) -> None:
        if not self.version().has_default_quotas:
            raise LustreError(f"default quotas (-U/-G/-P) need Lustre 2.12+, this is {self.version()}")

    def default_quota(self, kind: QuotaKind, mount: str) -> DefaultQuota:
        self._require_defaults()
        return parse_default_quota(self._read(("lfs", "quota", kind.default_flag, mount)).stdout, kind=kind)

    def grace_times(self, kind: QuotaKind, mount: str, pool: str | None = None) -> GraceTimes:
        argv = ["lfs", "quota", "-t", f"-{kind.value}"] + (["--pool", pool] if pool else []) + [mount]
        return parse_grace_times(self._read(argv).stdout)

    # pools
    def pools(self, fsname: str) -> tuple[str, ...]:
        return parse_pool_list(self._read(("lctl", "pool_list", fsname)).stdout, fsname)

    def pool(self, fsname: str, name: str) -> Pool:
        return parse_pool_members(self._read(("lctl", "pool_list", f"{fsname}.{name}")).stdout, fsname, name)

    # layout
    def getstripe(self, path: str) -> StripeLayout:
        return parse_getstripe(self._read(("lfs", "getstripe", "-d", path)).stdout)

    def getdirstripe(self, path: str, *, default: bool = False) -> DirStripe:
        argv = ("lfs", "getdirstripe", "-D", path) if default else ("lfs", "getdirstripe", path)
        return parse_getdirstripe(self._read(argv).stdout, default=default)

    def dir_mdt(self, path: str) -> int:
        return parse_getdirstripe_mdt(self._read(("lfs", "getdirstripe", "-m", path)).stdout)

    def project(self, path: str) -> ProjectInfo:
        return parse_project(self._read(("lfs", "project", "-d", path)).stdout)

    # space, health, stats
    def df(self, mount: str, *, inodes: bool = False, pool: str | None = None, fsname: str | None = None) -> DfReport:
        argv = ["lfs", "df"] + (["-i"] if inodes else [])
        if pool:
            if not fsname:
                raise ValueError("df by pool needs the filesystem name")
            argv += ["--pool", f"{fsname}.{pool}"]
        return parse_df_single(self._read(argv + [mount]).stdout, pool=pool)

    # server side (MDS/OSS): the osd parameters of the targets this node holds
    def _osd_params(self, fsname: str, names: Sequence[str]) -> dict[str, str]:
        patterns = [f"osd-*.{fsname}-*.{name}" for name in names]
        try:
            return parse_params(self._read(("lctl", "get_param", *patterns)).stdout)
        except LustreCommandError as exc:
            if "No such file or directory" in exc.stderr:
                return {}  # no target of this filesystem on this node
            raise

    def quota_enforcement(self, fsname: str) -> dict[str, str]:
        """``{target: "ugp"|...|"none"}`` from ``quota_slave*.enabled`` of this node's targets."""
        return osd_values(self._osd_params(fsname, (QUOTA_SLAVE_ENABLED,)), QUOTA_SLAVE_ENABLED)

    def server_targets(self, fsname: str) -> tuple[ServerTarget, ...]:
        """This server's MDTs and OSTs with their space and quota enforcement (``lctl get_param``)."""
        params = self._osd_params(fsname, (*SERVER_SPACE_PARAMS, QUOTA_SLAVE_ENABLED))
        values = {name: osd_values(params, name) for name in (*SERVER_SPACE_PARAMS, QUOTA_SLAVE_ENABLED)}
        names = sorted({t for per in values.values() for t in per})
        out = []
        for name in names:
            kind, index, _ = decode_target(name, "lctl get_param osd-*")

            def number(param: str, name: str = name) -> int | None:
                raw = values[param].get(name)
                return int(raw) if raw is not None and raw.isdigit() else None

            out.append(ServerTarget(name, kind, index, number("kbytestotal"), number("kbytesfree"),
                                    number("kbytesavail"), number("filestotal"), number("filesfree"),
                                    values[QUOTA_SLAVE_ENABLED].get(name)))
        return tuple(out)

    def health(self) -> Health:
        return parse_health(self._read(("lctl", "get_param", "-n", "health_check")).stdout)

    def stats(self, param: str) -> tuple[StatsBlock, ...]:
        """``lctl get_param PARAM`` for stats params; a param absent on this node gives no blocks."""
        try:
            result = self._read(("lctl", "get_param", param))
        except LustreCommandError as exc:
            # On a client or the wrong server role the param simply does not exist.
            if "No such file or directory" in exc.stderr or "not found" in exc.stderr:
                return ()
            raise
        return parse_stats(result.stdout)
