"""Repair actions the control plane may order: reset a GPU, restart a named service, reboot, drop
caches, and run the GPU diagnostic (``dcgmi diag``) that validates a repaired node.

Orders arrive only in the response to the agent's authenticated report (the agent listens on no
port that can act). Each order:
- is validated, and refused with a reason when malformed or not allowed by this node's config;
- checks its preconditions against the latest collection (no job on the GPU, no job on the node);
- supports ``dry_run`` (says exactly what it would run, changes nothing);
- is idempotent by order id: the result is persisted before it is reported, and the same id is
  never carried out twice, even across restarts or reboots;
- is logged (stderr -> the journal under systemd) with its order id.
"""

from __future__ import annotations

import enum
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from dlts_agent.config import ActionsConfig
from dlts_agent.dcgm import DiagOutputError, parse_diag
from dlts_agent.model import (
    AgentSnapshot,
    CollectorStatus,
    GpuReadout,
    GpuSample,
    JobsSample,
    OrderResult,
    OrderStatus,
)
from dlts_agent.state import AgentState

log = logging.getLogger("dlts_agent.actions")

REBOOT_CONFIRM_TIMEOUT_S = 900.0  # a reboot order still "in progress" after this on the same boot failed


class ActionKind(str, enum.Enum):
    RESET_GPU = "reset_gpu"
    RESTART_SERVICE = "restart_service"
    REBOOT = "reboot"
    DROP_CACHES = "drop_caches"
    GPU_DIAG = "gpu_diag"  # target LEVEL[:GPU,GPU...]: dcgmi diag -r LEVEL [-i GPUS]


@dataclass(frozen=True)
class Order:
    id: str
    action: ActionKind
    target: str
    dry_run: bool
    force: bool = False
    reason: str = ""


class CommandRunner(Protocol):
    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]: ...


def run_command(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer after {timeout_s:g} s"
    # whole (up to 1 MiB): a diagnostic's JSON is read in full; messages are cut where they are made
    return proc.returncode, (proc.stdout + proc.stderr).strip()[-(1 << 20):]


class OrderError(ValueError):
    pass


def parse_order(raw: Any) -> Order:
    if not isinstance(raw, Mapping):
        raise OrderError(f"an order must be a JSON object, got {type(raw).__name__}")
    oid = raw.get("id")
    if isinstance(oid, int) and not isinstance(oid, bool):
        oid = str(oid)
    if not isinstance(oid, str) or not oid or len(oid) > 128:
        raise OrderError("order.id must be a non-empty string (at most 128 characters)")
    try:
        action = ActionKind(raw.get("action"))
    except ValueError:
        raise OrderError(
            f"order {oid}: unknown action {raw.get('action')!r}; known: {', '.join(a.value for a in ActionKind)}"
        ) from None
    target = raw.get("target", "")
    if target is None:
        target = ""
    if isinstance(target, int) and not isinstance(target, bool):
        target = str(target)
    if not isinstance(target, str):
        raise OrderError(f"order {oid}: target must be a string")
    dry_run = raw.get("dry_run", False)
    force = raw.get("force", False)
    if not isinstance(dry_run, bool) or not isinstance(force, bool):
        raise OrderError(f"order {oid}: dry_run and force must be true or false")
    reason = raw.get("reason", "")
    return Order(oid, action, target.strip(), dry_run, force, str(reason)[:500])


class ActionExecutor:
    def __init__(
        self,
        cfg: ActionsConfig,
        state: AgentState,
        snapshot: Callable[[], AgentSnapshot | None],
        *,
        proc_root: str = "/proc",
        runner: CommandRunner = run_command,
        clock: Callable[[], float] = time.time,
        boot_id: Callable[[], str] = lambda: "",
    ) -> None:
        self.cfg = cfg
        self.state = state
        self.snapshot = snapshot
        self.proc_root = proc_root
        self.runner = runner
        self.clock = clock
        self.boot_id = boot_id
        self.executed_total = 0

    # -- results owed to the control plane ------------------------------------------------------

    def resolve_reboots(self) -> None:
        """After a restart: a reboot order from an earlier boot has succeeded."""
        now, boot = self.clock(), self.boot_id()
        with self.state.lock:
            for oid, rec in self.state.orders.items():
                if rec.get("status") != OrderStatus.IN_PROGRESS.value:
                    continue
                if rec.get("boot_id") and rec.get("boot_id") != boot:
                    rec.update(
                        status=OrderStatus.SUCCEEDED.value,
                        finished_at=now,
                        message=f"node rebooted (boot id {rec.get('boot_id')} -> {boot})",
                        reported=False,
                    )
                    log.info("order %s: reboot confirmed, new boot id %s", oid, boot)
                elif now - float(rec.get("started_at", now)) > REBOOT_CONFIRM_TIMEOUT_S:
                    rec.update(
                        status=OrderStatus.FAILED.value,
                        finished_at=now,
                        reported=False,
                        message=f"reboot requested but the node is still on boot {boot} after "
                        f"{REBOOT_CONFIRM_TIMEOUT_S:g} s",
                    )
                    log.error("order %s: reboot did not happen", oid)

    def unreported(self) -> list[OrderResult]:
        with self.state.lock:
            return [
                OrderResult.from_json(r)
                for r in self.state.orders.values()
                if not r.get("reported") and r.get("status") != OrderStatus.IN_PROGRESS.value
            ]

    def mark_reported(self, ids: list[str]) -> None:
        with self.state.lock:
            for oid in ids:
                if oid in self.state.orders:
                    self.state.orders[oid]["reported"] = True

    # -- execution ------------------------------------------------------------------------------

    def execute(self, raw: Any) -> OrderResult:
        now = self.clock()
        try:
            order = parse_order(raw)
        except OrderError as e:
            oid = str(raw.get("id")) if isinstance(raw, Mapping) and raw.get("id") not in (None, "") else ""
            result = OrderResult(
                oid,
                str(raw.get("action", "")) if isinstance(raw, Mapping) else "",
                "",
                OrderStatus.REJECTED,
                str(e),
                False,
                now,
                now,
            )
            log.warning("order %s rejected: %s", oid or "(no id)", e)
            if oid:
                self._record(result)
            return result
        with self.state.lock:
            existing = self.state.orders.get(order.id)
        if existing is not None:
            log.info("order %s: already handled (%s); not running it again", order.id, existing.get("status"))
            return OrderResult.from_json(existing)
        log.info(
            "order %s: %s target=%r dry_run=%s force=%s reason=%r",
            order.id,
            order.action.value,
            order.target,
            order.dry_run,
            order.force,
            order.reason,
        )
        if not self.cfg.enabled:
            return self._finish(order, now, OrderStatus.REJECTED, "actions are disabled on this node (actions.enabled)")
        handler = {
            ActionKind.RESET_GPU: self._reset_gpu,
            ActionKind.RESTART_SERVICE: self._restart_service,
            ActionKind.REBOOT: self._reboot,
            ActionKind.DROP_CACHES: self._drop_caches,
            ActionKind.GPU_DIAG: self._gpu_diag,
        }[order.action]
        try:
            status, message = handler(order, now)
        except Exception as e:  # noqa: BLE001 - an order must always get a result
            status, message = OrderStatus.FAILED, f"{type(e).__name__}: {e}"
        return self._finish(order, now, status, message)

    def _finish(self, order: Order, started: float, status: OrderStatus, message: str) -> OrderResult:
        finished = None if status is OrderStatus.IN_PROGRESS else self.clock()
        result = OrderResult(
            order.id,
            order.action.value,
            order.target,
            status,
            message,
            order.dry_run,
            started,
            finished,
            self.boot_id(),
        )
        if status is not OrderStatus.IN_PROGRESS:
            self._record(result)
        level = logging.INFO if status in (OrderStatus.SUCCEEDED, OrderStatus.DRY_RUN) else logging.WARNING
        log.log(level, "order %s: %s: %s", order.id, status.value, message)
        if status in (OrderStatus.SUCCEEDED, OrderStatus.FAILED):
            self.executed_total += 1
        return result

    def _record(self, result: OrderResult) -> None:
        with self.state.lock:
            rec = asdict(result)
            rec["status"] = result.status.value
            rec["reported"] = False
            self.state.orders[result.id] = rec
        self.state.save()

    def _run(self, argv: list[str]) -> tuple[OrderStatus, str]:
        rc, out = self.runner(argv, self.cfg.command_timeout_s)
        out = out[-2000:]
        if rc == 0:
            return OrderStatus.SUCCEEDED, f"ran {' '.join(argv)}" + (f": {out}" if out else "")
        return OrderStatus.FAILED, f"{' '.join(argv)} exited {rc}" + (f": {out}" if out else "")

    # -- the actions -----------------------------------------------------------------------

    def _reset_gpu(self, order: Order, now: float) -> tuple[OrderStatus, str]:
        snap = self.snapshot()
        gpu: GpuReadout | None = snap.collection.sample("gpu") if snap else None
        if gpu is None:
            return (
                OrderStatus.REJECTED,
                "no current GPU reading (NVML failed or not collected yet); cannot check the GPU",
            )
        g = _find_gpu(gpu, order.target)
        if g is None:
            known = ", ".join(f"{x.index}/{x.uuid}/{x.bus_id}" for x in gpu.gpus)
            return OrderStatus.REJECTED, f"no GPU {order.target!r} on this node (index/uuid/bus id): {known}"
        if g.lost:
            return (
                OrderStatus.REJECTED,
                f"{g.device} is lost (fallen off the bus); a reset cannot reach it, order a reboot",
            )
        if snap is None or snap.collection.status("jobs") is not CollectorStatus.OK:
            return OrderStatus.REJECTED, "cannot tell which jobs use the GPU (jobs collector not OK); refusing to reset"
        jobs: JobsSample = snap.collection.sample("jobs")
        holder = jobs.for_gpu(g)
        if holder is not None or g.pids:
            who = f"job {holder.job_id} ({holder.user})" if holder else f"processes {list(g.pids)}"
            return OrderStatus.REJECTED, f"{g.device} is in use by {who}; drain it first"
        argv = [self.cfg.nvidia_smi, "--gpu-reset", "-i", g.uuid or str(g.index)]
        if order.dry_run:
            return OrderStatus.DRY_RUN, f"would run {' '.join(argv)} ({g.device}, {g.bus_id})"
        status, message = self._run(argv)
        if status is OrderStatus.SUCCEEDED and g.bus_id:
            with self.state.lock:
                self.state.gpu_reset_at[g.bus_id] = self.clock()
        return status, message

    def _restart_service(self, order: Order, now: float) -> tuple[OrderStatus, str]:
        unit = order.target if "." in order.target else f"{order.target}.service"
        if unit not in self.cfg.restartable_services:
            return OrderStatus.REJECTED, (
                f"{unit!r} is not in actions.restartable_services "
                f"({', '.join(self.cfg.restartable_services) or 'empty'})"
            )
        argv = [self.cfg.systemctl, "restart", unit]
        if order.dry_run:
            return OrderStatus.DRY_RUN, f"would run {' '.join(argv)}"
        return self._run(argv)

    def _reboot(self, order: Order, now: float) -> tuple[OrderStatus, str]:
        if self.cfg.reboot_requires_no_jobs and not order.force:
            snap = self.snapshot()
            if snap is None or snap.collection.status("jobs") is not CollectorStatus.OK:
                return (
                    OrderStatus.REJECTED,
                    "cannot tell whether jobs run here (jobs collector not OK); send force to override",
                )
            jobs: JobsSample = snap.collection.sample("jobs")
            if jobs.job_ids:
                return OrderStatus.REJECTED, (
                    f"jobs still running here: {', '.join(sorted(jobs.job_ids))}; "
                    "drain the node first or send force: true"
                )
        argv = [self.cfg.systemctl, "reboot"]
        if order.dry_run:
            return OrderStatus.DRY_RUN, f"would run {' '.join(argv)}"
        # Persist "in progress" with this boot id *before* rebooting: after the restart the new boot
        # id proves success, and the same order id is never run again.
        rec = OrderResult(
            order.id,
            order.action.value,
            order.target,
            OrderStatus.IN_PROGRESS,
            "reboot requested",
            False,
            now,
            None,
            self.boot_id(),
        )
        with self.state.lock:
            d = asdict(rec)
            d["status"] = rec.status.value
            d["reported"] = False
            self.state.orders[order.id] = d
        self.state.save()
        status, message = self._run(argv)
        if status is OrderStatus.FAILED:
            return status, message
        return OrderStatus.IN_PROGRESS, message

    def _drop_caches(self, order: Order, now: float) -> tuple[OrderStatus, str]:
        path = os.path.join(self.proc_root, "sys/vm/drop_caches")
        if order.dry_run:
            return OrderStatus.DRY_RUN, f"would sync and write 3 to {path}"
        os.sync()  # dirty pages are not dropped; write them out first so the drop frees them
        with open(path, "w", encoding="ascii") as f:
            f.write("3\n")
        return OrderStatus.SUCCEEDED, f"synced and wrote 3 to {path}"


    def _gpu_diag(self, order: Order, now: float) -> tuple[OrderStatus, str]:
        """``dcgmi diag -r LEVEL -j`` on the order's GPUs (all when none are named), which must be
        free of jobs: a diagnostic on a busy GPU fails (graphics processes) and disturbs the job."""
        level_text, _, gpu_text = order.target.partition(":")
        if level_text not in ("1", "2", "3", "4"):
            return OrderStatus.REJECTED, f"gpu_diag target {order.target!r}: expected LEVEL[:GPU,...] with LEVEL 1-4"
        snap = self.snapshot()
        gpu: GpuReadout | None = snap.collection.sample("gpu") if snap else None
        if gpu is None:
            return OrderStatus.REJECTED, "no current GPU reading (NVML failed or not collected yet)"
        wanted = []
        for t in filter(None, (x.strip() for x in gpu_text.split(","))):
            g = _find_gpu(gpu, t)
            if g is None:
                return OrderStatus.REJECTED, f"no GPU {t!r} on this node"
            wanted.append(g)
        targets = wanted or list(gpu.gpus)
        if not order.force:
            if snap is None or snap.collection.status("jobs") is not CollectorStatus.OK:
                return OrderStatus.REJECTED, "cannot tell which jobs use the GPUs (jobs collector not OK); refusing the diagnostic"
            jobs: JobsSample = snap.collection.sample("jobs")
            busy = [f"{g.device} (job {h.job_id})" for g in targets if (h := jobs.for_gpu(g)) is not None]
            if busy:
                return OrderStatus.REJECTED, f"in use: {', '.join(busy)}; drain first or send force: true"
        argv = [self.cfg.dcgmi, "diag", "-r", level_text, "-j"]
        if wanted:
            argv += ["-i", ",".join(str(g.index) for g in wanted)]
        if order.dry_run:
            return OrderStatus.DRY_RUN, f"would run {' '.join(argv)}"
        rc, out = self.runner(argv, self.cfg.diag_timeout_s)
        command = " ".join(argv[1:])
        if rc == 127 and "not found" in out:
            return OrderStatus.SKIPPED, f"dcgmi is not installed on this node ({self.cfg.dcgmi}: command not found)"
        try:
            diag = parse_diag(out)
        except DiagOutputError as e:
            tail = " ".join(out.split())[-300:]
            return OrderStatus.FAILED, f"dcgmi {command} exited {rc} without a result ({e})" + (f": {tail}" if tail else "")
        if diag.failed:
            return OrderStatus.FAILED, f"dcgmi {command}: failed: {'; '.join(diag.failed)}"[:1000]
        if rc != 0:
            return OrderStatus.FAILED, f"dcgmi {command} exited {rc} with no failed test"
        if not diag.ran:
            return OrderStatus.FAILED, f"dcgmi {command}: no test ran (all skipped: {', '.join(diag.skipped) or 'none'})"[:1000]
        warned = f"; warnings: {', '.join(diag.warned)}" if diag.warned else ""
        return OrderStatus.SUCCEEDED, f"dcgmi {command}: {diag.ran} tests passed{warned}"[:1000]


def _find_gpu(readout: GpuReadout, target: str) -> GpuSample | None:
    from dlts_agent.nvml import normalize_bus_id

    t = target.strip()
    for g in readout.gpus:
        if t == str(g.index) or (g.uuid and t == g.uuid):
            return g
    bus = normalize_bus_id(t) if ":" in t else None
    for g in readout.gpus:
        if bus and g.bus_id == bus:
            return g
    return None
