"""Slurm's sbatch submission rate on this machine, for the side-by-side with POST /api/v1/jobs.

    .venv/bin/python bench/api_slurm.py [--jobs 400] [--tuned]

Starts munged and a single-node slurmctld + slurmd under /tmp/dlts_slurm (the configuration of
shared/reference/tools-here.md, section 4; --tuned adds batch_sched_delay=0,sched_min_interval=0),
submits --jobs jobs with `sbatch -Q -o /dev/null --wrap=true`, serially (1 client) and from 8
concurrent clients, and reports accepted jobs/s (sbatch returns once slurmctld has accepted and
saved the job). Stops the daemons it started (by pid) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

BASE = Path("/tmp/dlts_slurm")
CONF = """ClusterName=dltsbench
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MaxJobCount=100000
MinJobAge=60
{sched}
NodeName=localhost NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=16 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def start(tuned: bool) -> dict:
    if BASE.exists():
        shutil.rmtree(BASE)
    for d in ("state", "log", "spool/localhost"):
        (BASE / d).mkdir(parents=True)
    sched = "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000" if tuned else ""
    (BASE / "slurm.conf").write_text(CONF.format(base=BASE, sched=sched))
    env = os.environ | {"SLURM_CONF": str(BASE / "slurm.conf")}
    started = {}
    if subprocess.run(["bash", "-c", "munge -n | unmunge"], capture_output=True).returncode != 0:
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        started["munged"] = Path("/run/munge/munged.pid")
    subprocess.run(["slurmctld", "-f", str(BASE / "slurm.conf")], check=True, env=env)
    subprocess.run(["slurmd", "-f", str(BASE / "slurm.conf"), "-N", "localhost"], check=True, env=env)
    started["slurmctld"] = BASE / "slurmctld.pid"
    started["slurmd"] = BASE / "slurmd-localhost.pid"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env).stdout.strip()
        if out in ("idle", "mix", "alloc"):
            return {"env": env, "pids": started}
        time.sleep(0.5)
    raise SystemExit(f"slurmd did not become idle: {out!r}")


def stop(state: dict) -> None:
    for pidfile in state["pids"].values():
        try:
            os.kill(int(pidfile.read_text().strip()), 15)
        except (OSError, ValueError):
            pass


def submit(env: dict, jobs: int, clients: int) -> dict:
    per = jobs // clients
    failures = [0]

    def client() -> None:
        for _ in range(per):
            if subprocess.run(["sbatch", "-Q", "-o", "/dev/null", "--wrap=true"], env=env, capture_output=True).returncode != 0:
                failures[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    accepted = per * clients - failures[0]
    return {"clients": clients, "accepted": accepted, "elapsed_s": round(elapsed, 2), "jobs_per_s": round(accepted / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--tuned", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    state = start(args.tuned)
    try:
        result = {"tuned": args.tuned, "serial": submit(state["env"], args.jobs, 1)}
        subprocess.run(["scancel", "--user=root"], env=state["env"])
        result["parallel_8"] = submit(state["env"], args.jobs, 8)
        subprocess.run(["scancel", "--user=root"], env=state["env"])
    finally:
        stop(state)
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
