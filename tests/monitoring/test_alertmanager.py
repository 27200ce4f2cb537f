"""The monitoring role's Alertmanager configuration, rendered from its template: amtool accepts it,
and a real Alertmanager (Debian's prometheus-alertmanager) routes alerts by severity. A critical
alert reaches the e-mail receiver (a real SMTP server on loopback) and the webhook. A warning
reaches only the e-mail. Both use the subject and body of monitoring/alertmanager/dlts.tmpl."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import jinja2
import pytest
import requests
import yaml

from tests.smtp_server import free_port

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE = ROOT / "ansible" / "roles" / "monitoring" / "templates" / "alertmanager.yml.j2"
DEFAULTS = ROOT / "ansible" / "roles" / "monitoring" / "defaults" / "main.yml"
pytestmark = [pytest.mark.timeout(120)]


def render(dest: Path, **variables) -> Path:
    """The template with the role's defaults and ``variables``, through Jinja2 with Ansible's two
    filters it uses (to_json, bool)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)  # as Ansible
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
    values = {k: v for k, v in yaml.safe_load(DEFAULTS.read_text()).items() if "{{" not in str(v)}
    values |= {"ansible_managed": "rendered by the test"} | variables
    dest.write_text(env.from_string(TEMPLATE.read_text()).render(**values))
    return dest


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is required (apt-get install prometheus-alertmanager)")
    return path


class Webhook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_rendered_config_passes_amtool_with_and_without_a_webhook(tmp_path):
    templates = str(ROOT / "monitoring" / "alertmanager")
    for name, webhook in (("plain", ""), ("webhook", "http://127.0.0.1:9/hook")):
        config = render(tmp_path / f"{name}.yml", monitoring_alert_email_to="ops@example.org",
                        monitoring_smtp_from="am@example.org", monitoring_smtp_smarthost="127.0.0.1:25",
                        monitoring_alert_webhook_url=webhook, monitoring_alertmanager_templates_dir=templates)
        result = subprocess.run([tool("amtool"), "check-config", str(config)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and " - 1 templates" in result.stdout, result.stdout + result.stderr
        routes = yaml.safe_load(config.read_text())["route"]["routes"]
        assert [r["receiver"] for r in routes] == (["critical-webhook", "warning", "info"] if webhook
                                                   else ["critical", "warning", "info"])


def test_alertmanager_mails_by_severity_with_the_templates_and_calls_the_webhook(tmp_path, smtp_server):
    Webhook.received = []
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    port = free_port()
    config = render(tmp_path / "alertmanager.yml", monitoring_alert_email_to="ops@example.org",
                    monitoring_smtp_from="alertmanager@example.org",
                    monitoring_smtp_smarthost=f"127.0.0.1:{smtp_server.port}", monitoring_smtp_require_tls=False,
                    monitoring_alert_webhook_url=f"http://127.0.0.1:{hook.server_port}/hook",
                    monitoring_alert_group_wait_s=1,
                    monitoring_alertmanager_templates_dir=str(ROOT / "monitoring" / "alertmanager"))
    proc = subprocess.Popen([tool("prometheus-alertmanager"), f"--config.file={config}",
                             f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "not ready"
            time.sleep(0.2)
        now = dt.datetime.now(dt.UTC).isoformat()
        alerts = [
            {"labels": {"alertname": "DltsNodeLost", "severity": "critical", "node": "gpu-017", "cluster": "east"},
             "annotations": {"summary": "Node gpu-017 is lost (no heartbeat)", "runbook": "Power-cycle it through the BMC.",
                             "runbook_url": "docs/monitoring.md#dltsnodelost"}, "startsAt": now},
            {"labels": {"alertname": "DltsDiskNearlyFull", "severity": "warning", "node": "gpu-018", "cluster": "east",
                        "mount": "/"},
             "annotations": {"summary": "/ on gpu-018 is 93% full", "runbook": "Find the largest users with du."},
             "startsAt": now},
        ]
        assert requests.post(f"{url}/api/v2/alerts", json=alerts, timeout=5).status_code == 200
        deadline = time.monotonic() + 45
        while len(smtp_server.received) < 2 or not Webhook.received:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, (smtp_server.received, Webhook.received)
            time.sleep(0.3)
        mails = {m.message["Subject"]: m for m in smtp_server.received}
        assert set(mails) == {"[FIRING:1] critical: DltsNodeLost on east (gpu-017)",
                              "[FIRING:1] warning: DltsDiskNearlyFull on east (gpu-018)"}, set(mails)
        critical = mails["[FIRING:1] critical: DltsNodeLost on east (gpu-017)"]
        assert critical.rcpt_tos == ["ops@example.org"] and critical.mail_from == "alertmanager@example.org"
        body = critical.message.get_body(("plain",)).get_content()
        assert "FIRING: Node gpu-017 is lost (no heartbeat)" in body
        assert "Runbook: Power-cycle it through the BMC. (docs/monitoring.md#dltsnodelost)" in body
        assert "node=gpu-017" in body and "severity=critical" in body
        # only the critical alert goes to the webhook (monitoring_alert_webhook_severities: [critical])
        time.sleep(2)
        hooked = [a["labels"]["alertname"] for call in Webhook.received for a in call["alerts"]]
        assert hooked == ["DltsNodeLost"], hooked
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        hook.shutdown()
