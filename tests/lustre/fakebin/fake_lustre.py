"""A stateful fake of Lustre's `lfs` and `lctl` for the dlts_lustre tests.

State is one JSON file, $DLTS_FAKE_LUSTRE_DIR/state.json (tests/lustre/conftest.py writes it); every
invocation is appended to $DLTS_FAKE_LUSTRE_DIR/calls.log as a JSON argv. Output follows the formats
recorded in tests/lustre/fixtures/ (the <= 2.16.0 quota layout, or the 2.16.52+ one when the state's
version says so). Only the subset of options dlts_lustre uses is implemented; anything else exits 2
with a usage error, like the real tools.

Nodes: each invocation runs on the node named by $DLTS_FAKE_LUSTRE_NODE (default "client"). The
state says which node is the MGS ("mgs_node", default "mgs") and where each target lives (an MDT's
or OST's "node", default "mds" / "oss"). As on a real cluster, pool changes and conf_param work only
on the MGS (elsewhere: "This command must be run on the MGS.", ENODEV), and the osd-* parameters
(quota_slave.enabled/info, kbytes*, files*) exist only on the node that holds the target.

Test hooks in the state: "fail" {"lfs df": {"rc": 5, "stderr": "..."}}, "raw" {"lfs df": "text"}
(stdout replaced verbatim) and "sleep_s" {"lfs df": 5}; keys are "TOOL SUBCOMMAND".
Standard library only: it runs under whichever interpreter $DLTS_FAKE_LUSTRE_PYTHON names.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
import time

STATE_DIR = os.environ.get("DLTS_FAKE_LUSTRE_DIR", "")
STATE_PATH = os.path.join(STATE_DIR, "state.json")
NODE = os.environ.get("DLTS_FAKE_LUSTRE_NODE", "client")
SUFFIX_KIB = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3, "P": 1024**4, "E": 1024**5}
POOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,15}$")


class Fail(Exception):
    def __init__(self, rc: int, message: str) -> None:
        super().__init__(message)
        self.rc = rc
        self.message = message


def load() -> dict:
    with open(STATE_PATH) as fh:
        return json.load(fh)


def save(state: dict) -> None:
    tmp = STATE_PATH + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1, sort_keys=True)
    os.replace(tmp, STATE_PATH)


def version_tuple(state: dict) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", state["version"])[:3])


def new_format(state: dict) -> bool:
    return version_tuple(state) >= (2, 16, 52)


def size_kib(text: str) -> int:
    m = re.match(r"^(\d+)([KMGTPE]?)$", text, re.IGNORECASE)
    if not m:
        raise Fail(22, f"lfs setquota: bad limit '{text}'")
    return int(m[1]) * (SUFFIX_KIB[m[2].upper()] if m[2] else 1)


def grace_s(text: str) -> int:
    if text == "notify":
        return -1
    if text.isdigit():
        return int(text)
    m = re.match(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$", text)
    if not m or not any(m.groups()):
        raise Fail(22, f"lfs setquota: bad grace time '{text}'")
    mults = (604800, 86400, 3600, 60, 1)
    return sum(int(v) * k for v, k in zip(m.groups(), mults) if v)


def fmt_grace(seconds: int) -> str:
    if seconds == -1:
        return "notify"
    if seconds == 0:
        return "0s"
    out, rest = "", seconds
    for unit, mult in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, mult)
        if count:
            out += f"{count}{unit}"
    return out


def parse_ost_arg(state: dict, token: str) -> list[int]:
    fs = state["fsname"]
    m = re.match(rf"^(?:{re.escape(fs)}-)?OST\[(\d+)-(\d+)(?:/(\d+))?\]$", token)
    if m:
        return list(range(int(m[1]), int(m[2]) + 1, int(m[3] or 1)))
    m = re.match(rf"^(?:{re.escape(fs)}-)?OST([0-9a-fA-F]{{4}})(?:_UUID)?$", token)
    if m:
        return [int(m[1], 16)]
    if token.isdigit():
        return [int(token)]
    raise Fail(22, f"pool: invalid OST name '{token}'")


def resolve_id(state: dict, kind: str, ident: str) -> tuple[str, int]:
    table = {"u": state.get("users", {}), "g": state.get("groups", {}), "p": {}}[kind]
    if ident.isdigit():
        num = int(ident)
        name = next((n for n, v in table.items() if v == num), ident)
        return name, num
    if ident in table:
        return ident, table[ident]
    word = {"u": "user", "g": "group", "p": "project"}[kind]
    raise Fail(22, f"lfs: can't find {word} '{ident}'")


# ---------------------------------------------------------------- nodes

def is_mgs(state: dict) -> bool:
    return state.get("mgs_node", "mgs") == NODE


def local_targets(state: dict) -> list[tuple[str, dict]]:
    """(kind, target) of the MDTs and OSTs this node holds."""
    out = [("MDT", t) for t in state["mdts"] if t.get("node", "mds") == NODE]
    return out + [("OST", t) for t in state["osts"] if t.get("node", "oss") == NODE]


def not_on_mgs(what: str) -> Fail:
    # lctl's get_mgs_device() prints the first line; the command's perror()/error line follows
    return Fail(19, f"This command must be run on the MGS.\n{what}: No such device")


# ---------------------------------------------------------------- lfs quota / setquota

def quota_record(state: dict, kind: str, num: int) -> dict:
    return state["quotas"].setdefault(kind, {}).setdefault(
        str(num), {"bs": 0, "bh": 0, "is": 0, "ih": 0, "used_kib": 0, "used_inodes": 0,
                   "explicit": False})


def effective_limits(state: dict, kind: str, rec: dict) -> tuple[dict, bool]:
    default = state.get("defaults", {}).get(kind, {"bs": 0, "bh": 0, "is": 0, "ih": 0})
    if not rec["explicit"] and any(default[k] for k in ("bs", "bh", "is", "ih")):
        return default, True
    return rec, False


def grace_column(used: int, soft: int, hard: int, remaining_s: int | None, new: bool) -> tuple[str, str]:
    """(mark, grace) for one half of the row."""
    over_soft = soft and used > soft
    over_hard = hard and used > hard
    mark = "*" if (over_soft or over_hard) else ""
    if not over_soft:
        return mark, "-"
    if remaining_s is not None and remaining_s <= 0:
        return mark, "expired" if new else "none"
    return mark, fmt_grace(remaining_s if remaining_s is not None else 604800)


def lfs_quota(state: dict, args: list[str]) -> str:
    verbose = "-v" in args
    quiet = "-q" in args
    delim = None
    pool = None
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--delimiter="):
            delim = a.split("=", 1)[1]
        elif a == "--pool":
            pool = args[i + 1]
            i += 1
        elif a not in ("-v", "-q"):
            rest.append(a)
        i += 1
    if rest and rest[0] == "-t":
        kind = rest[1][1]
        table = state.get("pool_grace", {}).get(pool, {}) if pool else state.get("grace", {})
        g = table.get(kind, {"b": 604800, "i": 604800})
        return f"Block grace time: {fmt_grace(g['b'])}; Inode grace time: {fmt_grace(g['i'])}\n"
    if rest and rest[0] in ("-U", "-G", "-P"):
        if version_tuple(state) < (2, 12, 0):
            raise Fail(22, f"lfs quota: invalid option -- '{rest[0][1]}'")
        kind = rest[0][1].lower()
        mount = rest[1]
        d = state.get("defaults", {}).get(kind, {"bs": 0, "bh": 0, "is": 0, "ih": 0})
        g = state.get("grace", {}).get(kind, {"b": 604800, "i": 604800})
        word = {"u": "usr", "g": "grp", "p": "prj"}[kind]
        lines = [f"Disk default {word} quota:",
                 "     Filesystem  bquota  blimit  bgrace  iquota  ilimit  igrace"]
        if len(mount) > 15 and not new_format(state):
            lines += [f"{mount}", (f"{'':15} {d['bs']:>7} {d['bh']:>7} {fmt_grace(g['b']):>7} {d['is']:>7} "
                      f"{d['ih']:>7} {fmt_grace(g['i']):>7}")]
        else:
            lines.append(f"{mount:>15} {d['bs']:>7} {d['bh']:>7} {fmt_grace(g['b']):>7} {d['is']:>7} "
                         f"{d['ih']:>7} {fmt_grace(g['i']):>7}")
        return "\n".join(lines) + "\n"
    if len(rest) != 3 or rest[0] not in ("-u", "-g", "-p"):
        raise Fail(2, "lfs quota: usage: quota [-q] [-v] [-u|-g|-p ID] MOUNT")
    kind, ident, mount = rest[0][1], rest[1], rest[2]
    if mount != state["mount"]:
        raise Fail(19, f"lfs quota: '{mount}' is not on a Lustre filesystem: No such device")
    if delim is not None and not new_format(state):
        raise Fail(2, f"lfs quota: unrecognized option '--delimiter={delim}'")
    name, num = resolve_id(state, kind, ident)
    rec = quota_record(state, kind, num)
    lim, uses_default = effective_limits(state, kind, rec)
    if pool:
        rec = state.get("pool_quotas", {}).get(pool, {}).get(kind, {}).get(str(num), rec)
        lim, uses_default = rec, False
    new = new_format(state)
    bmark, bgrace = grace_column(rec["used_kib"], lim["bs"], lim["bh"], rec.get("block_grace_remaining_s"), new)
    imark, igrace = grace_column(rec["used_inodes"], lim["is"], lim["ih"], rec.get("inode_grace_remaining_s"), new)
    inaccurate = bool(state.get("quota_inaccurate"))
    used = f"[{rec['used_kib']}]" if inaccurate else str(rec["used_kib"])
    values = [used + bmark, str(lim["bs"]), str(lim["bh"]), bgrace,
              str(rec["used_inodes"]) + imark, str(lim["is"]), str(lim["ih"]), igrace]
    word = {"u": "usr", "g": "grp", "p": "prj"}[kind]
    idword = {"u": "uid", "g": "gid", "p": "pid"}[kind]
    lines = []
    if quiet:  # no title, no header; before 2.16.52 a long mount point still sits on its own line
        if delim:
            lines.append(delim.join([mount] + values))
        else:
            row = " ".join(f"{v:>7}" for v in values)
            lines += [mount, f"{'':15} {row}"] if len(mount) > 15 and not new_format(state) else [f"{mount:>15} {row}"]
        return "\n".join(lines) + "\n"
    lines.append(f"Disk quotas for {word} {name} ({idword} {num}):")
    if pool:
        lines.append(f"Quotas for pool: {pool}")
    if new:
        lines.append("     Filesystem  kbytes  bquota  blimit  bgrace   files  iquota  ilimit  igrace")
    else:
        lines.append("     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace")
    row = " ".join(f"{v:>7}" for v in values)
    if len(mount) > 15 and not new:
        lines += [mount, f"{'':15} {row}"]
    else:
        lines.append(f"{mount:>15} {row}")
    if verbose:
        fs = state["fsname"]

        def target_row(uuid: str, cells: list) -> list[str]:
            numbers = " ".join(f"{c:>7}" for c in cells)
            # Before 2.16.52 a name longer than 15 characters goes on its own line.
            return [f"{uuid} {numbers}"] if new else [uuid, f"{'':15} {numbers}"]

        for mdt in state["mdts"]:
            inodes = rec["used_inodes"] if mdt["index"] == 0 else 0
            lines += target_row(f"{fs}-MDT{mdt['index']:04x}_UUID", [0, "-", 0, "-", inodes, "-", 0, "-"])
        for ost in state["osts"]:
            uuid = f"{fs}-OST{ost['index']:04x}_UUID"
            if not ost.get("active", True):
                lines.append(uuid + "[inact]")
                continue
            share = rec["used_kib"] // max(1, len(state["osts"]))
            lines += target_row(uuid, [share, "-", 0, "-", "-", "-", "-", "-"])
        lines.append("Total allocated inode limit: 0, total allocated block limit: 0")
    if uses_default:
        if lim["bs"] or lim["bh"]:
            lines.append(f"{kind}id {num} is using default block quota setting")
        if lim["is"] or lim["ih"]:
            lines.append(f"{kind}id {num} is using default file quota setting")
    if inaccurate:
        lines.append('Some errors happened when getting quota info. Some devices may be not working or '
                     'deactivated. The data in "[]" is inaccurate.')
    return "\n".join(lines) + "\n"


def parse_limit_opts(args: list[str]) -> tuple[dict, list[str]]:
    limits: dict = {}
    rest: list[str] = []
    keys = {"-b": "bs", "-B": "bh", "-i": "is", "-I": "ih"}
    i = 0
    while i < len(args):
        if args[i] in keys:
            limits[keys[args[i]]] = args[i + 1]
            i += 2
            continue
        rest.append(args[i])
        i += 1
    return limits, rest


def check_soft_hard(limits: dict) -> None:
    for soft, hard, what in (("bs", "bh", "block"), ("is", "ih", "file")):
        if limits.get(hard) and limits.get(soft, 0) > limits[hard]:
            raise Fail(22, f"lfs setquota: {what} softlimit '{limits[soft]}' greater than hardlimit "
                           f"'{limits[hard]}'")


def lfs_setquota(state: dict, args: list[str]) -> str:
    if args and args[0] == "-t":
        kind = args[1][1]
        rest_t = args[2:]
        grace_table = state.setdefault("grace", {})
        if rest_t[:1] == ["--pool"]:
            grace_table = state.setdefault("pool_grace", {}).setdefault(rest_t[1], {})
            rest_t = rest_t[2:]
        limits, _ = parse_limit_opts(rest_t)
        g = grace_table.setdefault(kind, {"b": 604800, "i": 604800})
        if "bs" in limits:
            g["b"] = grace_s(limits["bs"])
        if "is" in limits:
            g["i"] = grace_s(limits["is"])
        return ""
    if args and args[0] in ("-U", "-G", "-P"):
        if version_tuple(state) < (2, 12, 0):
            raise Fail(22, f"lfs setquota: invalid option -- '{args[0][1]}'")
        kind = args[0][1].lower()
        raw, _ = parse_limit_opts(args[1:])
        limits = {k: size_kib(v) if k in ("bs", "bh") else int(v) for k, v in raw.items()}
        check_soft_hard(limits)
        state.setdefault("defaults", {}).setdefault(kind, {"bs": 0, "bh": 0, "is": 0, "ih": 0}).update(limits)
        return ""
    if len(args) < 3 or args[0] not in ("-u", "-g", "-p"):
        raise Fail(2, "lfs setquota: usage: setquota {-u|-g|-p} ID [-b ..] [-B ..] [-i ..] [-I ..] MOUNT")
    kind, ident = args[0][1], args[1]
    _, num = resolve_id(state, kind, ident)
    rest_args = args[2:]
    pool = None
    if rest_args[:1] == ["--pool"]:
        pool, rest_args = rest_args[1], rest_args[2:]
    rec = quota_record(state, kind, num)
    if rest_args[:1] == ["--default"]:
        rec["explicit"] = False
        rec.update({"bs": 0, "bh": 0, "is": 0, "ih": 0})
        return ""
    raw, _ = parse_limit_opts(rest_args)
    limits = {k: size_kib(v) if k in ("bs", "bh") else int(v) for k, v in raw.items()}
    check_soft_hard(limits)
    if pool:
        target = state.setdefault("pool_quotas", {}).setdefault(pool, {}).setdefault(kind, {}).setdefault(
            str(num), dict(rec))
        target.update(limits)
        return ""
    if not rec["explicit"]:
        base, _ = effective_limits(state, kind, rec)
        rec.update({k: base[k] for k in ("bs", "bh", "is", "ih")})
    rec.update(limits)
    rec["explicit"] = True
    return ""


# ---------------------------------------------------------------- lfs df

def lfs_df(state: dict, args: list[str]) -> str:
    inodes = "-i" in args
    pool = None
    if "--pool" in args:
        pool = args[args.index("--pool") + 1].split(".", 1)[1]
        if pool not in state["pools"]:
            raise Fail(22, f"lfs df: pool '{pool}' does not exist")
    fs, mount = state["fsname"], state["mount"]
    if inodes:
        lines = ["UUID                      Inodes       IUsed       IFree IUse% Mounted on"]
    else:
        lines = ["UUID                   1K-blocks        Used   Available Use% Mounted on"]
    totals = [0, 0, 0]

    def row(kind: str, t: dict) -> None:
        uuid = f"{fs}-{kind}{t['index']:04x}_UUID"
        if not t.get("active", True):
            lines.append(f"{kind}{t['index']:04x}            : inactive device")
            return
        total = t["inodes_total"] if inodes else t["kib_total"]
        used = t["inodes_used"] if inodes else t["kib_used"]
        avail = total - used
        pct = -(-100 * used // total) if total else 0
        flags = (" " + t["flags"]) if t.get("flags") else ""
        lines.append(f"{uuid:<20} {total:>11} {used:>11} {avail:>11} {pct:>3}% {mount}[{kind}:{t['index']}]{flags}")
        if kind == "OST" or inodes:
            totals[0] += total
            totals[1] += used
            totals[2] += avail

    for mdt in state["mdts"]:
        if pool is None:
            row("MDT", mdt)
    for ost in state["osts"]:
        if pool is None or ost["index"] in state["pools"][pool]:
            row("OST", ost)
    pct = -(-100 * totals[1] // totals[0]) if totals[0] else 0
    lines += ["", f"filesystem_summary: {totals[0]:>11} {totals[1]:>11} {totals[2]:>11} {pct:>3}% {mount}", ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- layout and projects

def dir_rec(state: dict, path: str) -> dict:
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise Fail(2, f"lfs: cannot open '{path}': No such file or directory")
    return state["dirs"].setdefault(path, {"mdt": inherited_mdt(state, path), "lmv_count": 0,
                                           "default_dirstripe": None, "layout": None,
                                           "projid": 0, "inherit": False})


def inherited_mdt(state: dict, path: str) -> int:
    parent = state["dirs"].get(os.path.dirname(path))
    if parent is None:
        return 0
    default = parent.get("default_dirstripe")
    if default and default["offset"] == -1:
        # Round-robin over MDTs, as the space-balanced default does on an empty filesystem.
        state["rr"] = (state.get("rr", -1) + 1) % len(state["mdts"])
        return state["rr"]
    return parent["mdt"]


def parse_opts(args: list[str], with_value: set[str], flags: set[str] = frozenset()) -> tuple[dict, list[str]]:
    opts: dict = {}
    rest = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in with_value:
            opts[a] = args[i + 1]
            i += 2
            continue
        if a in flags:
            opts[a] = True
        else:
            rest.append(a)
        i += 1
    return opts, rest


def lfs_mkdir(state: dict, args: list[str]) -> str:
    opts, rest = parse_opts(args, {"-i", "-c", "-H"})
    if len(rest) != 1:
        raise Fail(2, "lfs mkdir: usage: mkdir [-c COUNT] [-i MDT] [-H HASH] DIR")
    path = os.path.abspath(rest[0])
    if os.path.exists(path):
        raise Fail(17, f"lfs mkdir: dirstripe error on '{path}': File exists")
    if not os.path.isdir(os.path.dirname(path)):
        raise Fail(2, f"lfs mkdir: dirstripe error on '{path}': No such file or directory")
    index = int(opts.get("-i", "-2"))
    count = int(opts.get("-c", "0"))
    if index >= len(state["mdts"]) or count > len(state["mdts"]):
        raise Fail(22, f"lfs mkdir: dirstripe error on '{path}': Invalid argument")
    os.mkdir(path)
    rec = dir_rec(state, path)
    if index == -1:
        state["rr"] = (state.get("rr", -1) + 1) % len(state["mdts"])
        rec["mdt"] = state["rr"]
    elif index >= 0:
        rec["mdt"] = index
    rec["lmv_count"] = count if count > 1 else 0
    parent = state["dirs"].get(os.path.dirname(path))
    if parent and parent["inherit"]:
        rec["projid"], rec["inherit"] = parent["projid"], True
    return ""


def lfs_setdirstripe(state: dict, args: list[str]) -> str:
    opts, rest = parse_opts(args, {"-i", "-c"}, {"-D"})
    if not opts.get("-D") or len(rest) != 1:
        raise Fail(2, "lfs setdirstripe: only '-D -c N -i IDX DIR' is supported by the fake")
    rec = dir_rec(state, rest[0])
    count = int(opts.get("-c", "1"))
    if count == 0 or count < -1 or count > len(state["mdts"]):
        raise Fail(22, f"lfs setdirstripe: default stripe count {count} is invalid for "
                       f"{len(state['mdts'])} MDTs: Invalid argument")
    rec["default_dirstripe"] = {"count": count, "offset": int(opts.get("-i", "-1"))}
    return ""


def lfs_getdirstripe(state: dict, args: list[str]) -> str:
    opts, rest = parse_opts(args, set(), {"-D", "-m"})
    rec = dir_rec(state, rest[0])
    if opts.get("-m"):
        return f"{rec['mdt']}\n"
    if opts.get("-D"):
        d = rec.get("default_dirstripe")
        if not d:
            return "lmv_stripe_count: 0 lmv_stripe_offset: -1 lmv_hash_type: none\n"
        return (f"lmv_stripe_count: {d['count']} lmv_stripe_offset: {d['offset']} lmv_hash_type: none "
                "lmv_max_inherit: 3 lmv_max_inherit_rr: 0\n")
    if rec["lmv_count"] > 1:
        out = [f"lmv_stripe_count: {rec['lmv_count']} lmv_stripe_offset: {rec['mdt']} lmv_hash_type: fnv_1a_64",
               "mdtidx\t\t FID[seq:oid:ver]"]
        for k in range(rec["lmv_count"]):
            idx = (rec["mdt"] + k) % len(state["mdts"])
            out.append(f"     {idx}\t\t [0x2000{idx}0400:0x{k + 2:x}:0x0]")
        return "\n".join(out) + "\n"
    return f"lmv_stripe_count: 0 lmv_stripe_offset: {rec['mdt']} lmv_hash_type: none\n"


def lfs_setstripe(state: dict, args: list[str]) -> str:
    opts, rest = parse_opts(args, {"--pool", "-p", "-c", "-S"})
    if len(rest) != 1:
        raise Fail(2, "lfs setstripe: usage: setstripe [--pool POOL] [-c N] [-S SIZE] DIR")
    rec = dir_rec(state, rest[0])
    pool = opts.get("--pool") or opts.get("-p")
    if pool is not None:
        if pool not in state["pools"]:
            raise Fail(22, f"lfs setstripe: pool '{state['fsname']}.{pool}' does not exist: Invalid argument")
        if not state["pools"][pool]:
            raise Fail(22, f"lfs setstripe: pool '{state['fsname']}.{pool}' is empty: Invalid argument")
    layout = rec["layout"] or {"count": 1, "size": 1048576, "pool": None}
    if pool is not None:
        layout["pool"] = pool
    if "-c" in opts:
        layout["count"] = int(opts["-c"])
    if "-S" in opts:
        layout["size"] = size_kib(opts["-S"]) * 1024
    rec["layout"] = layout
    return ""


def lfs_getstripe(state: dict, args: list[str]) -> str:
    _, rest = parse_opts(args, set(), {"-d"})
    rec = dir_rec(state, rest[0])
    layout = rec["layout"]
    if layout is None:
        return f"{os.path.abspath(rest[0])} has no stripe info\n"
    line = f"stripe_count:  {layout['count']} stripe_size:   {layout['size']} pattern:       raid0 stripe_offset: -1"
    if layout.get("pool"):
        line += f" pool:          {layout['pool']}"
    return line + "\n"


def lfs_project(state: dict, args: list[str]) -> str:
    opts, rest = parse_opts(args, {"-p"}, {"-s", "-r", "-d"})
    if len(rest) != 1:
        raise Fail(2, "lfs project: usage: project [-p ID -s -r | -d] DIR")
    path = os.path.abspath(rest[0])
    rec = dir_rec(state, path)
    if opts.get("-d"):
        return f"{rec['projid']:5d} {'P' if rec['inherit'] else '-'} {path}\n"
    if "-p" not in opts:
        raise Fail(2, "lfs project: -p ID is required to set a project")
    targets = [path]
    if opts.get("-r"):
        for root, dirs, _files in os.walk(path):
            targets += [os.path.join(root, d) for d in dirs]
    for target in targets:
        r = dir_rec(state, target)
        r["projid"] = int(opts["-p"])
        if opts.get("-s"):
            r["inherit"] = True
    return ""


# ---------------------------------------------------------------- lctl

def lctl_pool(state: dict, sub: str, args: list[str]) -> str:
    args = [a for a in args if a != "-n"]
    fs = state["fsname"]
    if sub != "pool_list" and not is_mgs(state):
        raise not_on_mgs(sub)
    if sub == "pool_list" and NODE != "client" and not is_mgs(state) and not any(
            kind == "MDT" for kind, _ in local_targets(state)):
        raise Fail(1, "Cannot run pool_list command since there is no local MGS/MDT or client")
    if sub == "pool_list":
        if len(args) != 1:
            raise Fail(2, "lctl pool_list: usage: pool_list FSNAME[.POOL]")
        if "." not in args[0]:
            if args[0] != fs:
                raise Fail(19, f"pool_list: cannot open {args[0]}: No such device")
            return "\n".join([f"Pools from {fs}:"] + [f"{fs}.{p}" for p in sorted(state["pools"])]) + "\n"
        name = args[0].split(".", 1)[1]
        if name not in state["pools"]:
            raise Fail(22, f"pool_list: {args[0]} is not a valid pool: Invalid argument")
        return "\n".join([f"Pool: {fs}.{name}"] + [f"{fs}-OST{i:04x}_UUID" for i in state["pools"][name]]) + "\n"
    if not args or "." not in args[0]:
        raise Fail(2, f"lctl {sub}: usage: {sub} FSNAME.POOL ...")
    pfs, name = args[0].split(".", 1)
    if pfs != fs:
        raise Fail(19, f"{sub}: {pfs}: No such device")
    pools = state["pools"]
    if sub == "pool_new":
        if not POOL_NAME_RE.match(name) or name in ("none", "ignore", "inherit"):
            raise Fail(22, f"pool_new: {name}: Invalid argument")
        if name in pools:
            raise Fail(17, f"pool_new: {fs}.{name}: File exists")
        pools[name] = []
        return ""
    if name not in pools:
        raise Fail(2, f"{sub}: pool {fs}.{name} not found: No such file or directory")
    if sub == "pool_destroy":
        if pools[name]:
            raise Fail(39, f"pool_destroy: {fs}.{name} is not empty: Directory not empty")
        del pools[name]
        return ""
    indices = [i for tok in args[1:] for i in parse_ost_arg(state, tok)]
    known = {o["index"] for o in state["osts"]}
    if sub == "pool_add":
        for i in indices:
            if i not in known:
                raise Fail(2, f"pool_add: {fs}-OST{i:04x} is not a valid OST: No such file or directory")
            if i in pools[name]:
                raise Fail(17, f"pool_add: {fs}-OST{i:04x} is already in pool {fs}.{name}: File exists")
        pools[name] = sorted(pools[name] + indices)
        return ""
    if sub == "pool_remove":
        for i in indices:
            if i not in pools[name]:
                raise Fail(2, f"pool_remove: {fs}-OST{i:04x} is not in pool {fs}.{name}: No such file or directory")
        pools[name] = [i for i in pools[name] if i not in indices]
        return ""
    raise Fail(2, f"lctl: unknown command {sub}")


def stats_blocks(state: dict, family: str) -> str:
    fs = state["fsname"]
    blocks = state.get("stats", {}).get(family)
    if not blocks:
        path = {"obdfilter": "obdfilter/*/stats", "mdt": "mdt/*/md_stats"}[family]
        raise Fail(2, f"error: get_param: param_path '{path}': No such file or directory")
    out = []
    for target, block in sorted(blocks.items()):
        param = f"obdfilter.{fs}-{target}.stats" if family == "obdfilter" else f"mdt.{fs}-{target}.md_stats"
        now = block["snapshot_time"]
        out += [f"{param}=", f"snapshot_time             {now:.9f} secs.nsecs",
                f"start_time                {block.get('start_time', 0.0):.9f} secs.nsecs",
                f"elapsed_time              {now - block.get('start_time', 0.0):.9f} secs.nsecs"]
        for name, c in block["counters"].items():
            if c["samples"] == 0:
                continue  # Lustre omits counters with no samples
            unit = c.get("unit", "reqs")
            if "sum" in c:
                out.append(f"{name:<25} {c['samples']} samples [{unit}] {c['min']} {c['max']} {c['sum']} {c.get('sumsq', 0)}")
            else:
                out.append(f"{name:<25} {c['samples']} samples [{unit}]")
    return "\n".join(out) + "\n"


QUOTA_TYPES_RE = re.compile(r"^(none|[ugp]+)$")


def quota_types(state: dict, kind: str) -> str:
    value = state.get("quota_enforced", {}).get(kind.lower(), "none")
    return value or "none"


def osd_params(state: dict) -> dict[str, str]:
    """The osd-* parameters of the targets this node holds, as lctl names them (2.15 names)."""
    fs = state["fsname"]
    out = {}
    for kind, t in local_targets(state):
        if not t.get("active", True):
            continue
        base = f"osd-ldiskfs.{fs}-{kind}{t['index']:04x}"
        enabled = quota_types(state, kind)
        out[f"{base}.quota_slave.enabled"] = enabled
        out[f"{base}.quota_slave.info"] = (
            f"target name:    {fs}-{kind}{t['index']:04x}\npool ID:        0\ntype:           "
            f"{'md' if kind == 'MDT' else 'dt'}\nquota enabled:  {enabled}\nconn to master: setup\n"
            "space acct:     ugp\nuser uptodate:  glb[1],slv[1],reint[0]\ngroup uptodate: glb[1],slv[1],reint[0]\n"
            "project uptodate: glb[1],slv[1],reint[0]")
        free = t["kib_total"] - t["kib_used"]
        out[f"{base}.kbytestotal"] = str(t["kib_total"])
        out[f"{base}.kbytesfree"] = str(free)
        out[f"{base}.kbytesavail"] = str(max(0, free - t.get("kib_reserved", 0)))
        out[f"{base}.filestotal"] = str(t["inodes_total"])
        out[f"{base}.filesfree"] = str(t["inodes_total"] - t["inodes_used"])
    return out


def lctl_get_param(state: dict, args: list[str]) -> str:
    bare = "-n" in args
    names = [a for a in args if not a.startswith("-")]
    if names == ["health_check"]:
        return state.get("health", "healthy") + "\n" if bare else f"health_check={state.get('health', 'healthy')}\n"
    if names == ["obdfilter.*.stats"]:
        return stats_blocks(state, "obdfilter")
    if names == ["mdt.*.md_stats"]:
        return stats_blocks(state, "mdt")
    params = osd_params(state)
    out = []
    for pattern in names:
        matched = sorted(n for n in params if fnmatch.fnmatchcase(n, pattern))
        if not matched:
            path = pattern.replace(".", "/")
            raise Fail(2, f"error: get_param: param_path '{path}': No such file or directory")
        for name in matched:
            value = params[name]
            if bare:
                out.append(value)
            elif "\n" in value:  # a multi-line value: the name on its own line, then the value
                out += [f"{name}=", value]
            else:
                out.append(f"{name}={value}")
    return "\n".join(out) + "\n"


def lctl_list_param(state: dict, args: list[str]) -> str:
    names = [a for a in args if not a.startswith("-")]
    params = osd_params(state)
    out = []
    for pattern in names:
        matched = sorted(n for n in params if fnmatch.fnmatchcase(n, pattern))
        if not matched:
            raise Fail(2, f"error: list_param: param_path '{pattern.replace('.', '/')}': No such file or directory")
        out += matched
    return "\n".join(out) + "\n"


def lctl_conf_param(state: dict, args: list[str]) -> str:
    if not is_mgs(state):
        raise not_on_mgs("error: conf_param")
    delete = "-d" in args
    rest = [a for a in args if a != "-d"]
    if len(rest) != 1:
        raise Fail(2, "usage: conf_param [-d] <target.keyword=val>")
    key, _, value = rest[0].partition("=")
    parts = key.split(".")
    if len(parts) < 2 or parts[0] != state["fsname"]:
        raise Fail(2, "error: conf_param: No such file or directory")
    if parts[1:2] == ["quota"]:
        if len(parts) != 3 or parts[2] not in ("mdt", "ost"):
            raise Fail(22, "error: conf_param: Invalid argument")
        if delete:
            state.setdefault("quota_enforced", {}).pop(parts[2], None)
            return ""
        if not value or not QUOTA_TYPES_RE.match(value):
            raise Fail(22, "error: conf_param: Invalid argument")
        state.setdefault("quota_enforced", {})[parts[2]] = "".join(t for t in "ugp" if t in value) or "none"
        return ""
    state.setdefault("conf_params", {})[key] = None if delete else value
    return ""


# ---------------------------------------------------------------- dispatch

def dispatch(tool: str, args: list[str], state: dict) -> str:
    if tool == "lfs":
        if args == ["--version"]:
            return f"lfs {state['version']}\n"
        sub, rest = (args[0], args[1:]) if args else ("", [])
        handlers = {"quota": lfs_quota, "setquota": lfs_setquota, "df": lfs_df, "mkdir": lfs_mkdir,
                    "setdirstripe": lfs_setdirstripe, "getdirstripe": lfs_getdirstripe,
                    "setstripe": lfs_setstripe, "getstripe": lfs_getstripe, "project": lfs_project}
        if sub not in handlers:
            raise Fail(2, f"lfs: unknown command '{sub}'")
        return handlers[sub](state, rest)
    sub, rest = (args[0], args[1:]) if args else ("", [])
    if sub.startswith("pool_"):
        return lctl_pool(state, sub, rest)
    if sub == "get_param":
        return lctl_get_param(state, rest)
    if sub == "list_param":
        return lctl_list_param(state, rest)
    if sub == "conf_param":
        return lctl_conf_param(state, rest)
    raise Fail(2, f"lctl: unknown command '{sub}'")


READS = {"quota", "df", "getstripe", "getdirstripe", "pool_list", "get_param", "list_param", "--version"}


def is_read(tool: str, args: list[str]) -> bool:
    return bool(args) and (args[0] in READS or (args[0] == "project" and "-d" in args))


def main() -> int:
    tool, args = sys.argv[1], sys.argv[2:]
    if not STATE_DIR:
        sys.stderr.write(f"{tool}: DLTS_FAKE_LUSTRE_DIR is not set\n")
        return 2
    with open(os.path.join(STATE_DIR, "calls.log"), "a") as log:
        log.write(json.dumps([tool] + args) + "\n")
    state = load()
    key = f"{tool} {args[0] if args else ''}"
    if key in state.get("sleep_s", {}):
        time.sleep(state["sleep_s"][key])
    if key in state.get("fail", {}):
        fail = state["fail"][key]
        sys.stderr.write(fail.get("stderr", "") + "\n")
        return int(fail["rc"])
    try:
        out = dispatch(tool, args, state)
    except Fail as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.rc
    if key in state.get("raw", {}):
        out = state["raw"][key]
    if not is_read(tool, args):
        save(state)  # reads never change state, even where a handler filled in defaults
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
