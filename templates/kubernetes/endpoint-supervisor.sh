#!/bin/sh
# DLTS endpoint supervisor: starts and stops the servers behind a job's endpoints (ssh, Jupyter,
# VS Code) inside the job's container. The job's entrypoint starts it in the background on the pods
# the endpoint Service selects; it prints one line per action, which lands in the job's log.
#
# It reads, every $DLTS_ENDPOINTS_POLL_S seconds (5), the files of the attempt's endpoint ConfigMap
# mounted at $DLTS_ENDPOINTS_DIR (/dlts-endpoints), which the job manager updates and the kubelet
# refreshes within about a minute:
#   endpoints        one endpoint per line: ID KIND PORT [SECRET_SHA256]
#   authorized_keys  the SSH public keys of the job's owner
# For each listed endpoint not yet started it starts: ssh -> sshd on PORT (public keys only), with
# its own config, as the container's user: the job's owner logs in under their own name and uid, and
# every session gets the job's environment (DLTS_*, CUDA_*, NVIDIA_*, MASTER_ADDR, PATH, ...);
# jupyter -> "jupyter server" on PORT whose password is the endpoint's token (SHA-256 given);
# vscode -> "code-server" on PORT, same; port -> nothing (the job's own server listens there).
# Servers of endpoints no longer listed are stopped. A server that exits is started again, up to
# 5 times. A missing program is reported once, with what to install; it is picked up when it appears.
#
# Operators may replace this file (templates_dir/kubernetes/endpoint-supervisor.sh): keep reading
# the two files above, keep it POSIX sh, and keep its output short (it goes to users' job logs).

dir=${DLTS_ENDPOINTS_DIR:-/dlts-endpoints}
state=${DLTS_ENDPOINTS_STATE:-/tmp/dlts-endpoints}
poll_s=${DLTS_ENDPOINTS_POLL_S:-5}
max_starts=5

say() { printf 'dlts-endpoints: %s\n' "$*"; }

# private bookkeeping; the servers keep the job's umask
if ! (umask 077 && mkdir -p "$state"); then
    say "cannot create $state; endpoints (ssh, jupyter, vscode) will not start in this job"
    exit 1
fi

is_root() { [ "$(id -u)" = 0 ]; }

alive() {  # ID: is the server of endpoint ID running?
    [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null
}

start_bg() {  # ID COMMAND...: run COMMAND in the background, in its own session when possible
    _id=$1; shift
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" </dev/null &
    else
        "$@" </dev/null &
    fi
    echo $! >"$state/$_id.pid"
}

stop_server() {  # ID
    _pid=$(cat "$state/$1.pid" 2>/dev/null)
    if [ -n "$_pid" ]; then
        # its session's process group first (setsid), else the process alone
        kill -TERM "-$_pid" 2>/dev/null || kill -TERM "$_pid" 2>/dev/null
        (sleep 10; kill -KILL "-$_pid" 2>/dev/null || kill -KILL "$_pid" 2>/dev/null) >/dev/null 2>&1 &
    fi
}

missing() {  # ID LINE: say LINE once for endpoint ID
    if [ ! -f "$state/$1.missing" ]; then
        say "$2"
        : >"$state/$1.missing"
    fi
}

find_sshd() {
    for _c in "$(command -v sshd 2>/dev/null)" /usr/sbin/sshd /usr/local/sbin/sshd /usr/bin/sshd; do
        if [ -n "$_c" ] && [ -x "$_c" ]; then echo "$_c"; return 0; fi
    done
    return 1
}

ssh_login() {  # sets _login to the login sshd accepts here; says why ssh cannot work and fails when none
    if is_root; then
        if [ "$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status 2>/dev/null)" = 0000000000000000 ]; then
            say "ssh: this container runs as root without capabilities, and sshd needs SETUID, SETGID and SYS_CHROOT to log anyone in; run the job as its owner (without run_as_root) to use ssh"
            return 1
        fi
        _login=root
        if [ -n "${DLTS_USER:-}" ] && id "$DLTS_USER" >/dev/null 2>&1; then _login=$DLTS_USER; fi
        return 0
    fi
    # Non-root: sshd logs in only the user it runs as, by the name /etc/passwd gives this uid
    # (the pod's dlts-identity init container added the job's owner there).
    if ! _login=$(id -un 2>/dev/null) || [ -z "$_login" ]; then
        say "ssh: uid $(id -u) has no name in this container's /etc/passwd, so sshd cannot log anyone in"
        return 1
    fi
    if [ -n "${DLTS_USER:-}" ] && [ "$_login" != "$DLTS_USER" ]; then
        say "ssh: log in as $_login (the job's owner $DLTS_USER, uid $(id -u), under a name the container accepts)"
    fi
}

session_env() {  # the sshd_config SetEnv line: the job's environment, for every ssh session
    # sshd reads only the first SetEnv line, so every variable goes on one. Names come from env's
    # output; each value is read from the shell's own variable, so a value holding a newline
    # cannot inject a variable (such values are left out: a config line cannot hold them).
    # Variables sshd sets for the session itself, and the supervisor's own, are skipped.
    env | {
        _seen=" "
        _out=
        while IFS= read -r _line; do
            _name=${_line%%=*}
            case $_name in '' | *[!A-Za-z0-9_]* | [0-9]*) continue ;; esac
            case $_name in
                HOME | USER | LOGNAME | SHELL | PWD | OLDPWD | SHLVL | TERM | MAIL | _ | SSH_* | \
                DLTS_ENDPOINTS_STATE | DLTS_ENDPOINTS_POLL_S | DLTS_SSH_HOST_KEY_PREFIX) continue ;;
            esac
            case $_seen in *" $_name "*) continue ;; esac
            _seen="$_seen$_name "
            eval "_set=\${$_name+x}"
            [ -n "$_set" ] || continue
            eval "_value=\$$_name"
            case $_value in *'
'*) continue ;; esac
            _out="$_out \"$_name=$(printf '%s' "$_value" | sed 's/[\\"]/\\&/g')\""
        done
        if [ -n "$_out" ]; then echo "SetEnv$_out"; fi
    }
}

start_ssh() {  # ID PORT
    if ! _sshd=$(find_sshd) || ! command -v ssh-keygen >/dev/null 2>&1; then
        missing "$1" "ssh (port $2): sshd is not installed in this job's image; install openssh-server in the image (apt-get install -y openssh-server, or apk add openssh-server); DLTS starts it once it is there"
        return
    fi
    rm -f "$state/$1.missing"
    # Host keys: the system's (generated once when missing); a non-root container keeps its own.
    _prefix=${DLTS_SSH_HOST_KEY_PREFIX:-}
    if [ -z "$_prefix" ] && ! is_root; then _prefix=$state/hostkeys; fi
    if [ -n "$_prefix" ]; then
        mkdir -p "$_prefix/etc/ssh" && ssh-keygen -A -f "$_prefix" </dev/null >/dev/null
    else
        ssh-keygen -A </dev/null >/dev/null
    fi || { say "ssh (port $2): ssh-keygen -A could not create host keys; ssh is not started"; : >"$state/$1.gaveup"; return; }
    if ! ssh_login; then : >"$state/$1.gaveup"; return; fi
    # Debian and Ubuntu's sshd needs its privilege separation directory (/run is often a fresh tmpfs)
    if is_root; then mkdir -p /run/sshd && chmod 755 /run/sshd; fi
    _conf=$state/sshd-$1.conf
    {
        echo "Port $2"
        for _t in rsa ecdsa ed25519; do
            [ -f "$_prefix/etc/ssh/ssh_host_${_t}_key" ] && echo "HostKey $_prefix/etc/ssh/ssh_host_${_t}_key"
        done
        echo "AuthorizedKeysFile $dir/authorized_keys"
        # the mounted keys live in a directory the kubelet owns: sshd's ownership checks would refuse them
        echo "StrictModes no"
        echo "PubkeyAuthentication yes"
        echo "PasswordAuthentication no"
        echo "KbdInteractiveAuthentication no"
        echo "PermitRootLogin prohibit-password"
        echo "PidFile $state/sshd-$1.pid"
        echo "PrintMotd no"
        echo "Subsystem sftp internal-sftp"
        session_env
    } >"$_conf"
    start_bg "$1" "$_sshd" -D -e -f "$_conf"
    say "ssh: started sshd on port $2 for $_login (public keys of the job's owner; no passwords)"
}

start_jupyter() {  # ID PORT HASH
    if ! command -v jupyter >/dev/null 2>&1; then
        missing "$1" "jupyter (port $2): jupyter is not installed where the job runs; pip install jupyter-server (or jupyterlab) in the image or from the job; DLTS starts it once it is there"
        return
    fi
    rm -f "$state/$1.missing"
    start_bg "$1" jupyter server --no-browser --ip=0.0.0.0 --port="$2" --port-retries=0 --allow-root \
        --IdentityProvider.token= --PasswordIdentityProvider.hashed_password="sha256::$3"
    say "jupyter: started jupyter server on port $2 (password: the endpoint's token)"
}

start_vscode() {  # ID PORT HASH
    if ! command -v code-server >/dev/null 2>&1; then
        missing "$1" "vscode (port $2): code-server is not installed where the job runs; install it in the image (curl -fsSL https://code-server.dev/install.sh | sh); DLTS starts it once it is there"
        return
    fi
    rm -f "$state/$1.missing"
    start_bg "$1" env HASHED_PASSWORD="$3" code-server --bind-addr "0.0.0.0:$2" --auth password \
        --disable-telemetry --disable-update-check
    say "vscode: started code-server on port $2 (password: the endpoint's token)"
}

ensure() {  # ID KIND PORT HASH: the endpoint is listed; start its server unless it runs
    if [ ! -f "$state/$1.kind" ]; then
        echo "$2 $3" >"$state/$1.kind"
        [ "$2" = port ] && say "port $3: nothing to start; the job's own server must listen on 0.0.0.0:$3"
    fi
    [ "$2" = port ] && return
    if [ -f "$state/$1.gaveup" ] || alive "$1"; then return; fi
    if [ -f "$state/$1.pid" ]; then  # it ran and has exited
        rm -f "$state/$1.pid"
        _n=$(cat "$state/$1.starts" 2>/dev/null || echo 1)
        if [ "$_n" -ge "$max_starts" ]; then
            say "$2 (port $3) exited $_n times; not starting it again (its output is above); close and reopen the endpoint to retry"
            : >"$state/$1.gaveup"
            return
        fi
        say "$2 (port $3) exited; starting it again"
    fi
    case $2 in
        ssh) start_ssh "$1" "$3" ;;
        jupyter) start_jupyter "$1" "$3" "$4" ;;
        vscode) start_vscode "$1" "$3" "$4" ;;
        *) say "unknown endpoint kind $2 (port $3); this supervisor starts ssh, jupyter and vscode"
           : >"$state/$1.gaveup"
           return ;;
    esac
    if [ -f "$state/$1.pid" ]; then
        echo $(( $(cat "$state/$1.starts" 2>/dev/null || echo 0) + 1 )) >"$state/$1.starts"
    fi
}

remove() {  # ID WHY: the endpoint is no longer listed, or the supervisor stops
    read -r _kind _port _rest <"$state/$1.kind"
    if alive "$1"; then
        stop_server "$1"
        say "$_kind: stopped the server on port $_port ($2)"
    fi
    rm -f "$state/$1.kind" "$state/$1.pid" "$state/$1.starts" "$state/$1.missing" "$state/$1.gaveup" \
        "$state/sshd-$1.conf" "$state/sshd-$1.pid"
}

reconcile() {
    listed=" "
    if [ -r "$dir/endpoints" ]; then
        while read -r id kind port hash _rest; do
            case $id in '' | '#'*) continue ;; esac
            case $id:$port in *[!0-9:]* | :* | *:)
                say "ignoring a malformed line in $dir/endpoints: $id $kind $port"
                continue ;;
            esac
            listed="$listed$id "
            ensure "$id" "$kind" "$port" "$hash"
        done <"$dir/endpoints"
    fi
    for f in "$state"/*.kind; do
        [ -e "$f" ] || continue
        id=${f##*/}
        id=${id%.kind}
        case $listed in *" $id "*) ;; *) remove "$id" "endpoint closed" ;; esac
    done
}

stop_all() {
    for f in "$state"/*.kind; do
        [ -e "$f" ] || continue
        id=${f##*/}
        remove "${id%.kind}" "the supervisor is stopping"
    done
    exit 0
}
trap stop_all TERM INT

while :; do
    reconcile
    sleep "$poll_s"
done
