"""A torchrun-like rendezvous over TCP, for the tests of the rendezvous variables (no torch needed).

Run once per node (unit / pod): it starts ``LOCAL_WORLD_SIZE`` workers as torchrun does, each with
its global rank ``RANK + local rank``. Global rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` and
waits for every other rank to connect and say its rank; it prints the ranks it heard and answers
each. Exits 0 only when every worker on this node got through.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

TIMEOUT_S = 30.0


def worker(rank: int) -> int:
    world = int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    print(f"rank {rank} of {world} (node {os.environ['NODE_RANK']} of {os.environ['NNODES']}, local "
          f"{os.environ['LOCAL_RANK']} of {os.environ['LOCAL_WORLD_SIZE']}) master {addr}:{port}", flush=True)
    if rank == 0:
        with socket.create_server((addr, port)) as server:
            server.settimeout(TIMEOUT_S)
            heard, peers = [0], []
            while len(heard) < world:
                conn, _ = server.accept()
                heard.append(int(conn.makefile().readline()))
                peers.append(conn)
            for conn in peers:
                conn.sendall(b"ok\n")
                conn.close()
        print(f"rendezvous complete: ranks {sorted(heard)}", flush=True)
        return 0 if sorted(heard) == list(range(world)) else 1
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            with socket.create_connection((addr, port), timeout=TIMEOUT_S) as conn:
                conn.sendall(f"{rank}\n".encode())
                return 0 if conn.makefile().readline() == "ok\n" else 1
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                print(f"rank {rank}: nobody listens at {addr}:{port}", flush=True)
                return 1
            time.sleep(0.05)


def main() -> int:
    if "LOCAL_RANK" in os.environ:
        return worker(int(os.environ["RANK"]))
    base = int(os.environ["RANK"])
    procs = [subprocess.Popen([sys.executable, __file__], env={**os.environ, "LOCAL_RANK": str(i), "RANK": str(base + i)})
             for i in range(int(os.environ["LOCAL_WORLD_SIZE"]))]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
