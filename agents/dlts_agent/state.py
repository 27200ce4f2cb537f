"""The agent's persisted state: one JSON file in ``state_dir``, replaced atomically.

It holds what must survive a restart so that nothing is counted or done twice:
the kernel-log cursor together with the XID counts it produced (one file, one rename: a line is
either counted and its cursor saved, or neither), recent XID events for the detection window, the
time of each GPU's last successful reset, and the result of every repair order by id.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import Any

from dlts_agent.model import OrderResult

log = logging.getLogger(__name__)

STATE_VERSION = 1
MAX_ORDERS_KEPT = 500


class AgentState:
    def __init__(self, path: str | None) -> None:
        self.path = path  # None = in memory only (--once)
        self.lock = threading.RLock()
        self.kmsg_boot_id: str = ""
        self.kmsg_seq: int = -1
        self.journal_cursor: str = ""
        self.xid_counts: dict[tuple[str, int, str], int] = {}
        self.fell_off_bus_counts: dict[str, int] = {}
        self.recent_xids: list[dict[str, Any]] = []
        self.gpu_reset_at: dict[str, float] = {}  # bus id -> wall time of the last successful reset
        self.orders: dict[str, dict[str, Any]] = {}  # order id -> result (model.OrderResult)
        self.load_error: str | None = None
        self._saved: bytes | None = None  # what the file holds: skip identical rewrites (and fsyncs)
        # The collection loop and the order executor both save; one at a time, so an older
        # snapshot of the state can never be renamed over a newer one.
        self._save_lock = threading.Lock()

    @classmethod
    def load(cls, path: str | None) -> AgentState:
        st = cls(path)
        if path is None or not os.path.exists(path):
            return st
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            st._from_json(data)
        except Exception as e:  # noqa: BLE001 - any bad file (unreadable, not JSON, the wrong shape)
            # A bad state file must not stop the agent; starting over may recount old kernel
            # lines once, which is better than exporting nothing. The file is kept for a person.
            st = cls(path)
            bad = path + ".bad"
            try:
                os.replace(path, bad)
                kept = f"; the bad file is kept as {bad}"
            except OSError as err:
                kept = f"; it could not be moved aside ({err.strerror})"
            st.load_error = f"{path}: unusable state ({type(e).__name__}: {e}); starting with empty state{kept}"
            log.error("%s", st.load_error)
        return st

    def _from_json(self, data: Any) -> None:
        """Fill in from the saved JSON; ValueError/TypeError/KeyError when it has another shape."""
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {STATE_VERSION}")
        kmsg = _mapping(data.get("kmsg", {}), "kmsg")
        self.kmsg_boot_id = str(kmsg.get("boot_id", ""))
        self.kmsg_seq = int(kmsg.get("seq", -1))
        self.journal_cursor = str(data.get("journal_cursor", ""))
        self.xid_counts = {(str(b), int(x), str(s)): int(n) for b, x, s, n in _list(data.get("xid_counts", []), "xid_counts")}
        self.fell_off_bus_counts = {str(k): int(v) for k, v in _mapping(data.get("fell_off_bus_counts", {}),
                                                                        "fell_off_bus_counts").items()}
        recent = [dict(_mapping(e, "recent_xids[]")) for e in _list(data.get("recent_xids", []), "recent_xids")]
        for event in recent:  # what the XID collector reads back every round
            event["time_s"] = float(event["time_s"])
        self.recent_xids = recent
        self.gpu_reset_at = {str(k): float(v) for k, v in _mapping(data.get("gpu_reset_at", {}), "gpu_reset_at").items()}
        orders = {str(k): dict(_mapping(v, "orders[]")) for k, v in _mapping(data.get("orders", {}), "orders").items()}
        for order in orders.values():
            OrderResult.from_json(order)  # every record must read back as a result
            finished = order.get("finished_at")
            if finished is not None and (isinstance(finished, bool) or not isinstance(finished, (int, float))):
                raise ValueError(f"orders[].finished_at: expected a number, got {finished!r}")
        self.orders = orders

    def to_json(self) -> dict[str, Any]:
        with self.lock:
            orders = dict(sorted(self.orders.items(), key=lambda kv: kv[1].get("finished_at") or 0)[-MAX_ORDERS_KEPT:])
            return {
                "version": STATE_VERSION,
                "kmsg": {"boot_id": self.kmsg_boot_id, "seq": self.kmsg_seq},
                "journal_cursor": self.journal_cursor,
                "xid_counts": [[b, x, s, n] for (b, x, s), n in sorted(self.xid_counts.items())],
                "fell_off_bus_counts": dict(self.fell_off_bus_counts),
                "recent_xids": list(self.recent_xids),
                "gpu_reset_at": dict(self.gpu_reset_at),
                "orders": orders,
            }

    def save(self) -> None:
        if self.path is None:
            return
        with self._save_lock:
            self._save_locked(self.path)

    def _save_locked(self, path: str) -> None:
        data = json.dumps(self.to_json(), sort_keys=True).encode()
        if data == self._saved:
            return
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the cursor must not point past counts that were lost
            os.replace(tmp, path)
            self._saved = data
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{where}: expected a list, got {type(value).__name__}")
    return value
