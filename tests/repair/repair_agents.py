"""The real node agent for the repair tests: dlts_agent with a fake NVML at its seam, its command
runner wired to that fake (a GPU reset resets the fake GPU; a reboot restarts the agent on a new
boot id), and the loop that ticks the job manager and the repair manager. A uniquely named module
(not conftest) so test files can import it whatever other conftest.py files pytest loads."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))  # agent_testkit

from agent_testkit import FakeNode, agent_config, make_fake_node  # noqa: F401

from dlts_testing.fake_nvml import fake_dcgmi_diag


class FakeDriver:
    """The agent's command runner (its seam for nvidia-smi, systemctl and dcgmi) wired to the fake
    NVML: a GPU reset does to the fake what the driver does; dcgmi diag diagnoses the fake GPUs; a
    reboot is recorded for the harness to carry out (stop the agent, new boot id, GPUs fresh, start
    it again)."""

    def __init__(self, lib) -> None:
        self.lib = lib
        self.reset_works = True  # False: nvidia-smi says it reset the GPU, but nothing changed
        self.dcgmi_installed = True  # dcgmi diag reads the fake GPUs (dlts_testing.fake_nvml.fake_dcgmi_diag)
        self.reboot_requested = threading.Event()
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        self.commands.append(list(argv))
        if "--gpu-reset" in argv:
            target = argv[-1]
            index = next(i for i, g in enumerate(self.lib.gpus) if g.uuid == target or str(i) == target)
            if self.reset_works:
                self.lib.reset_gpu(index)
            return 0, f"GPU {target} was successfully reset."
        if argv[-1] == "reboot":
            self.reboot_requested.set()
            return 0, ""
        if argv[1:2] == ["diag"]:
            if not self.dcgmi_installed:
                return 127, f"{argv[0]}: command not found"
            return fake_dcgmi_diag(self.lib, argv)
        return 0, ""


@dataclass
class RunningAgent:
    name: str
    node: FakeNode
    lib: object
    driver: FakeDriver
    config: object
    agent: object = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    boots: int = 0

    def start(self) -> RunningAgent:
        from dlts_agent.agent import Agent

        self.stop = threading.Event()
        self.agent = Agent(self.config, nvml_lib=self.lib)
        self.agent.executor.runner = self.driver
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), name=f"agent-{self.name}", daemon=True)
        self.thread.start()
        assert self.agent.ready.wait(20), "the agent never finished its first collection"
        return self

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def reboot(self) -> None:
        """What a reboot does: the agent stops, the machine comes back on a new boot id with the
        driver freshly loaded (volatile ECC counters cleared, pending remaps applied)."""
        self.halt()
        self.boots += 1
        self.node.set_boot_id(f"4c6b5a4e-0d51-4d0a-9a55-5d0f0c8c{self.boots:04d}")
        for i, g in enumerate(self.lib.gpus):
            if not g.lost:
                self.lib.reset_gpu(i)
        self.driver.reboot_requested.clear()
        self.start()


def four_gpus(scenario_name: str):
    """A fake NVML scenario cut to the test node's 4 GPUs (the local backend's demo_gpus)."""
    from dlts_testing.fake_nvml import scenario

    lib = scenario(scenario_name)
    lib.gpus = lib.gpus[:4]
    return lib


def drive(live, repair, until, timeout_s: float = 60.0, agents=(), what: str = ""):
    """Tick the job manager and the repair manager until ``until()`` is true; carry out reboots."""
    deadline = time.monotonic() + timeout_s
    while True:
        live.tick()
        repair.run_once()
        for a in agents:
            if a.driver.reboot_requested.is_set():
                a.reboot()
        value = until()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or until}"
        time.sleep(0.15)


# The repair manager alone in its own process, for the stories that SIGKILL it again and again:
# python -c MANAGERS DATABASE_URL HOME REPAIR_SETTINGS_JSON; prints "ready", then passes every 0.05 s.
MANAGERS = textwrap.dedent("""
    import sys, time
    from dlts.db import session_factory
    from dlts.app import create_app
    from dlts.config import Settings
    from dlts.managers.repair import RepairManager
    from dlts.repair.settings import RepairSettings
    settings = Settings(home=sys.argv[2], database_url=sys.argv[1], secret_key="test-secret-key-0123456789",
                        repair=RepairSettings.model_validate_json(sys.argv[3]))
    manager = RepairManager(session_factory(create_app(settings)), settings)
    print("ready", flush=True)
    while True:
        manager.run_once()
        time.sleep(0.05)
""")
