"""The commands of a job pod's containers: what lets a job start from any public image.

A pod has up to two init containers and the job container, sharing the ``dlts-runtime`` emptyDir
mounted at ``/dlts-runtime``:

1. ``dlts-init`` (image ``init_image``, busybox: one static binary, ``/bin/busybox``) copies that
   binary to ``/dlts-runtime/busybox``. Nothing else is assumed of any image.
2. ``dlts-identity`` (the job's image, run by that busybox) writes ``/dlts-runtime/passwd`` and
   ``/dlts-runtime/group``: the image's own files plus the job owner's login with their uid/gid and
   their groups. The job container sees them as ``/etc/passwd`` and ``/etc/group`` (subPath
   mounts), so ``id``, ``getpass.getuser()`` and sshd know the owner, who is not in the image.
3. ``job`` runs ``/dlts-runtime/busybox sh -c ENTRYPOINT``: a shell DLTS knows, whatever the image
   has. ENTRYPOINT runs the job's command with the image's ``/bin/sh`` (the shell the image's
   users expect) or busybox's when the image has none, in a session of its own; it forwards
   SIGTERM/SIGINT to that whole process group and exits with the command's status. The pod shares
   one process namespace, so the pause container is PID 1 and reaps orphans.

The user's command only ever travels in ``$DLTS_COMMAND``, never pasted into a script, so nothing
in it can change these scripts. ``DLTS_RUNTIME_DIR`` (default ``/dlts-runtime``) exists so the
tests can run the scripts for real outside a pod.
"""

from __future__ import annotations

RUNTIME_DIR = "/dlts-runtime"
# The init image's binary, copied as it is: busybox images are static, so the copy runs in any image.
INIT_BINARY = "/bin/busybox"
INIT_COMMAND = (INIT_BINARY, "cp", INIT_BINARY, f"{RUNTIME_DIR}/busybox")
BUSYBOX = f"{RUNTIME_DIR}/busybox"

# dlts-identity: DLTS_LOGIN, DLTS_UID, DLTS_GID, DLTS_GROUPS (space-separated), HOME come from the
# container's env. Entries of the image with the owner's name or uid are replaced; groups the
# owner is given that the image lacks are added (named after the login for the primary group when
# the name is free, else dlts-<gid>), and the owner is listed as a member of their other groups.
IDENTITY_SCRIPT = r"""set -eu
rt=${DLTS_RUNTIME_DIR:-/dlts-runtime}
bb=$rt/busybox
umask 022
passwd=/etc/passwd; [ -r "$passwd" ] || passwd=/dev/null
group=/etc/group; [ -r "$group" ] || group=/dev/null
shell=/bin/sh
if [ -x /bin/bash ]; then shell=/bin/bash; fi
"$bb" awk -F: -v n="$DLTS_LOGIN" -v u="$DLTS_UID" '$1 != n && $3 != u' "$passwd" >"$rt/passwd.new"
printf '%s:x:%s:%s:DLTS job owner:%s:%s\n' "$DLTS_LOGIN" "$DLTS_UID" "$DLTS_GID" "$HOME" "$shell" >>"$rt/passwd.new"
"$bb" awk -F: -v OFS=: -v n="$DLTS_LOGIN" -v gid="$DLTS_GID" -v extra="${DLTS_GROUPS:-}" '
BEGIN { want[gid] = 1; k = split(extra, e, " "); for (i = 1; i <= k; i++) want[e[i]] = 1 }
{ names[$1] = 1
  if ($3 in want) { have[$3] = 1; if ($3 != gid) $4 = ($4 == "" ? n : $4 "," n) }
  print }
END { for (g in want) if (!(g in have)) {
        name = (g == gid && !(n in names)) ? n : "dlts-" g
        print name, "x", g, (g == gid ? "" : n) } }' "$group" >"$rt/group.new"
"$bb" mv "$rt/passwd.new" "$rt/passwd"
"$bb" mv "$rt/group.new" "$rt/group"
"""

# The job container's script, run by busybox sh. Until busybox setsid has made the job's session,
# a signal sent to the forked child could be swallowed by the shell's copy of the trap before it
# execs: signals arriving by then are remembered and forwarded once the session exists (a matter
# of milliseconds). ``wait`` returns early (>128) when a trapped signal arrives, keeping the job
# known to the shell; waiting again gives its real status once it has exited. Shells start background commands with SIGINT and
# SIGQUIT ignored when there is no job control (no tty), so a forwarded INT reaches programs that
# install their own handler; Kubernetes itself sends TERM. (busybox's kill takes no "--": a
# negative pid right after the signal names the process group.) The endpoint supervisor starts
# once ``supervisor.sh`` is in the endpoints directory: at once for a distributed job, else when
# the first endpoint's ConfigMap has been made and the kubelet has filled the (optional) mount.
ENTRYPOINT = r"""rt=${DLTS_RUNTIME_DIR:-/dlts-runtime}
bb=$rt/busybox
job=
started=
pending=
forward() {
    got=1
    if [ -z "$started" ]; then pending=$1; return; fi
    kill "-$1" "-$job" 2>/dev/null || kill "-$1" "$job" 2>/dev/null
}
trap 'forward TERM' TERM
trap 'forward INT' INT
if [ -n "${HOME:-}" ] && [ ! -d "$HOME" ]; then "$bb" mkdir -p "$HOME" 2>/dev/null; fi
sup=
if [ -n "${DLTS_ENDPOINTS_DIR:-}" ]; then
    (
        s=
        trap 'kill "$s" 2>/dev/null; exit 0' TERM
        while [ ! -r "$DLTS_ENDPOINTS_DIR/supervisor.sh" ]; do
            # without the job's output: a TERM between this fork and s=$! leaves the sleep running,
            # and it must not hold the job's log open until it ends
            "$bb" sleep "${DLTS_ENDPOINTS_POLL_S:-5}" >/dev/null 2>&1 &
            s=$!
            wait "$s"
        done
        exec "$bb" sh "$DLTS_ENDPOINTS_DIR/supervisor.sh"
    ) </dev/null &
    sup=$!
fi
if [ -x /bin/sh ]; then set -- /bin/sh; else set -- "$bb" sh; fi
"$bb" setsid "$@" -c "$DLTS_COMMAND" &
job=$!
n=0
while [ "$n" -lt 500 ] && ! kill -0 "-$job" 2>/dev/null && kill -0 "$job" 2>/dev/null; do
    "$bb" sleep 0.01
    n=$((n + 1))
done
started=1
if [ -n "$pending" ]; then forward "$pending"; fi
got=
wait "$job"
rc=$?
while [ -n "$got" ] && [ "$rc" -gt 128 ]; do
    got=
    wait "$job"
    r=$?
    if [ "$r" -eq 127 ]; then break; fi  # it had exited before the signal: rc is its status
    rc=$r
done
if [ -n "$sup" ]; then kill -TERM "$sup" 2>/dev/null; wait "$sup"; fi
exit "$rc"
"""
