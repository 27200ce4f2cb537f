"""The README's tour is a script: every shell block of "A short tour" runs, in order and as written,
against a real ``dlts demo`` started as the README's first command starts it, from a directory laid
out like a checkout (``.venv``, ``.dlts``). Only what differs per machine is replaced: the demo's
address (``127.0.0.1:5000``) and the tour's example port (8800), both by free ones. A command that
fails, or an id the tour would have had to guess, fails this test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from demo_kit import SRC, Demo, base_env, free_port

pytestmark = pytest.mark.timeout(900)
README = SRC / "README.md"


def tour_script(readme: str) -> str:
    """The ```sh blocks of the README's "A short tour" section, in order."""
    section = readme.split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 5, "the tour lost its shell blocks"
    return "\n".join(blocks)


def test_every_command_of_the_readme_tour_runs_as_written_against_the_demo(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))  # the environment the first command made
    demo = Demo(checkout / ".dlts", free_port(), tmp_path / "demo.log")
    demo.start(gpus=4)  # sh .ci/dev demo --demo-gpus 4
    port = free_port()
    script = tour_script(README.read_text()).replace("127.0.0.1:5000", f"127.0.0.1:{demo.port}")
    script = script.replace("8800", str(port))
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in base_env().items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config"),
            "DLTS_POLL_S": "0.2", "NO_COLOR": "1"}
    log = tmp_path / "tour.log"
    try:
        with open(log, "w") as out:
            # -x: the log shows each command before what it printed
            result = subprocess.run(["bash", "-c", "set -e -o pipefail -x\n" + script], cwd=checkout, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, text=True, timeout=600)
        said = log.read_text()
        assert result.returncode == 0, said[-6000:]
        assert "Traceback" not in said, said[-6000:]
        assert re.search(r"hello from alice on GPUs 0,1", said), said[-6000:]  # the --wait job's log, via curl
        for step in ("step 1", "step 2", "step 3"):
            assert step in said  # dlts logs -f followed the second job to its end
        assert re.search(rf"port-{port}\s+{port}\s+ready\s+http://127\.0\.0\.1:{port}/", said), said[-6000:]
        assert re.search(r"key \d+ added: ssh-ed25519", said)
        assert re.search(r'"id":\d+.*"status":"killing"', said)  # curl's kill of the running job
        assert re.search(r"job \d+: killing", said)  # dlts kill
        assert re.search(r"limit weight:\s+0\.25 \(vc\)", said)  # the admin's vc tune
        assert "kind: Pod" in said  # dlts render
        # the demo's terminal: the tour's requests, not the node agent's report of every second
        shown = demo.log.read_text()
        assert '"GET /api/v1/me HTTP/1.1" 200' in shown and "/report HTTP" not in shown, shown[-3000:]
    finally:
        demo.stop()
