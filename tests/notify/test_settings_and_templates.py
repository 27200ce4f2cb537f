"""The notify: section (a bad value stops start-up naming its key) and the shipped templates."""

from __future__ import annotations

import configparser
import fnmatch
import textwrap
from pathlib import Path

import pytest

from dlts.config import ConfigError, load_settings
from dlts.managers.notify import NotifyManager
from dlts.notify_settings import NotifySettings, SmtpSecurity
from dlts.services.notify import (
    DEFAULT_EMAIL_TEMPLATES,
    MailRenderer,
    TemplateError,
    split_subject,
)

ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path, text: str):
    path = tmp_path / "dlts.yaml"
    path.write_text(textwrap.dedent(text))
    return load_settings(path, environ={})


def test_a_full_notify_section_loads(tmp_path, password_file):
    settings = load(tmp_path, f"""
        notify:
          smtp_host: smtp.example.org
          security: starttls
          username: dlts
          password_file: {password_file}
          from_address: dlts@example.org
          rate_limit_per_hour: 10
    """)
    notify = settings.notify
    assert notify.is_enabled and notify.port == 587 and notify.security is SmtpSecurity.STARTTLS
    assert notify.read_password() == "s3cret-from-a-file"
    assert "s3cret" not in repr(settings), "the password is in no setting"


def test_without_a_host_the_notifier_is_off_and_ports_follow_the_security():
    assert not NotifySettings().is_enabled
    assert NotifySettings(smtp_host="mx", security="ssl", from_address="a@b.org").port == 465
    assert NotifySettings(smtp_host="mx", security="none", from_address="a@b.org").port == 25
    assert NotifySettings(smtp_host="mx", smtp_port=2525, from_address="a@b.org").port == 2525
    assert not NotifySettings(smtp_host="mx", from_address="a@b.org", enabled=False).is_enabled


@pytest.mark.parametrize("section, message", [
    ("smtp_port: 70000", "notify.smtp_port: Input should be less than or equal to 65535"),
    ("security: tls", "notify.security: Input should be 'starttls', 'ssl' or 'none'"),
    ("smtp_hots: mx", "notify.smtp_hots: unknown key"),
    ("enabled: true", "notify.smtp_host: Value error, must be set when enabled is true"),
    ("smtp_host: mx.example.org", "notify.from_address: Value error, must be set when the notifier is on"),
    ("{smtp_host: mx, from_address: 'DLTS <dlts@example.org>'}", "notify.from_address: Value error, must be one plain address"),
    ("{smtp_host: mx, from_address: a@b.org, username: u}", "notify.password_file: Value error, must be set when username is"),
    ("{smtp_host: mx, from_address: a@b.org, security: none, username: u, password_file: /x}",
     "notify.username: Value error, would send the password unencrypted"),
    ("{smtp_host: 'mx\\r\\nx', from_address: a@b.org}", "notify.smtp_host: Value error, must be a host name"),
    ("{retry_initial_s: 600, retry_max_s: 60}", "notify.retry_max_s: Value error, must be at least retry_initial_s"),
    ("{tls_ca_file: /no/such/ca.pem}", "notify.tls_ca_file: Value error, /no/such/ca.pem is not a readable file"),
    ("{subject_prefix: \"a\\nBcc: x\"}", "notify.subject_prefix: Value error, must be one line"),
    ("{portal_url: dlts.example.org}", "notify.portal_url: Value error, must start with http"),
])
def test_a_bad_value_stops_start_up_naming_its_key(tmp_path, section, message):
    if section.startswith("{"):
        text = f"notify: {section}\n"
    else:
        text = f"notify:\n  {section}\n"
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text)
    assert message in str(error.value)


def test_an_unreadable_or_empty_password_file_stops_start_up_naming_the_key(tmp_path, settings):
    empty = tmp_path / "empty"
    empty.write_text("")
    for path, says in [(tmp_path / "missing", "cannot read"), (empty, "is empty")]:
        notify = NotifySettings(smtp_host="mx", from_address="a@b.org", username="u", password_file=path)
        manager = NotifyManager(lambda: None, settings.model_copy(update={"notify": notify}))
        with pytest.raises(ConfigError, match=f"notify.password_file: .*{says}"):
            manager.check()


def test_a_templates_dir_that_is_not_a_directory_is_refused_at_start_up(tmp_path):
    with pytest.raises(TemplateError, match="templates_dir .* is not a directory"):
        MailRenderer(tmp_path / "nope")


CONTEXTS = {
    "node_out_of_service": {"node": "g1", "reason": "r", "state": "quarantined", "step": "reset_gpu", "cycle_id": 3,
                            "findings": ["f1", "f2"]},
    "node_escalated": {"node": "g1", "reason": "r", "state": "remediating", "step": "reboot", "cycle_id": 3, "findings": []},
    "node_needs_human": {"node": "g1", "reason": "r", "state": "out_of_service", "step": "ticket", "cycle_id": 3,
                         "findings": ["f1"]},
    "job_stopped_for_repair": {"job_id": 5, "job_name": "j", "vc": "vision", "user": "alice", "message": "m", "node": "g1"},
    "vc_notice": {"vc": "vision", "message": "line one\nline two", "author": "vcadmin"},
    "storage_alert": {"root": "/mnt/nfs", "used_percent": 91.5, "alert_percent": 90, "used": "9.1 TiB",
                      "total": "10.0 TiB", "paths": ["/mnt/nfs/alice  2.0 TiB  alice"], "owners": ["alice"]},
    "storage_expiry_warning": {"root": "/mnt/nfs", "owner": "bob", "files": 3, "size": "1.0 GiB",
                               "paths": ["/mnt/nfs/scratch/bob/a"], "expire_after_days": "30",
                               "delete_after": "2026-12-08 12:00 UTC"},
    "idle_job_warning": {"job_id": 5, "job_name": "j", "vc": "vision", "user": "alice", "message": "m", "action": "pause",
                         "since": "2026-12-01 10:00", "deadline": "2026-12-01 11:00"},
    "disk_pressure": {"host": "ctl1", "volume": "log", "path": "/srv/dlts/logs", "level": "hard",
                      "why": "812.0 KiB free, below the hard threshold of 1.0 GiB", "soft_free_bytes": 5368709120,
                      "hard_free_bytes": 1073741824},
    "idle_job_stopped": {"job_id": 5, "job_name": "j", "vc": "vision", "user": "alice", "message": "m", "action": "kill",
                         "since": "2026-12-01 10:00", "warned_at": "2026-12-01 10:30"},
}
MINIMAL = {"node_out_of_service": {"node": "g1", "reason": "r"}, "node_escalated": {"node": "g1", "reason": "r"},
           "node_needs_human": {"node": "g1", "reason": "r"},
           "job_stopped_for_repair": {"job_id": 5, "job_name": "j", "message": "m"}, "vc_notice": {"vc": "v", "message": "m"},
           "storage_alert": {"root": "/r", "used_percent": 91, "alert_percent": 90, "paths": []},
           "storage_expiry_warning": {"root": "/r", "files": 1, "size": "4 KiB", "paths": [], "expire_after_days": "3",
                                      "delete_after": "2026-12-08 12:00 UTC"},
           "idle_job_warning": {"job_id": 5, "job_name": "j", "vc": "v", "message": "m", "action": "none", "since": "s",
                                "deadline": "d"},
           "idle_job_stopped": {"job_id": 5, "job_name": "j", "vc": "v", "message": "m", "action": "pause", "since": "s",
                                "warned_at": "w"},
           "disk_pressure": {"host": "h", "volume": "run", "level": "soft", "why": "w"}}


@pytest.mark.parametrize("template", sorted(CONTEXTS))
def test_every_shipped_template_renders_with_the_keys_its_callers_pass_and_with_the_least(template):
    renderer = MailRenderer(None, portal_url="https://dlts.example.org")
    full = renderer.render(template, CONTEXTS[template])
    least = renderer.render(template, MINIMAL[template])
    assert full.subject and least.subject and "\n" not in full.subject
    assert "{{" not in full.body and full.body.endswith("\n") and "This message was sent by DLTS" in full.body
    assert "Undefined" not in least.body


def test_the_shipped_templates_are_exactly_the_documented_ones():
    names = sorted(p.name for p in DEFAULT_EMAIL_TEMPLATES.iterdir())
    assert names == ["_footer.txt.j2", "_node_details.txt.j2"] + [f"{t}.txt.j2" for t in sorted(CONTEXTS)]
    docs = (ROOT / "docs" / "notifications.md").read_text()
    for template in CONTEXTS:
        assert f"`{template}`" in docs, f"docs/notifications.md does not describe {template}"


def test_setup_cfg_ships_every_email_template():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    package_data = cfg["options.package_data"]

    def globs(package: str) -> list[str]:
        return [g.strip() for g in package_data.get(package, "").replace("\n", ",").split(",") if g.strip()]

    packages = {p.strip() for p in cfg["options"]["packages"].split()}
    for path in (ROOT / "templates" / "email").iterdir():
        relative = str(path.relative_to(ROOT / "templates"))
        # shipped as data of dlts.templates (email/...) or of the dlts.templates.email package
        shipped = any(fnmatch.fnmatch(relative, g) for g in globs("dlts.templates")) or (
            "dlts.templates.email" in packages and any(fnmatch.fnmatch(path.name, g) for g in globs("dlts.templates.email")))
        assert shipped, f"{relative} is not in package_data"


def test_a_multi_line_value_keeps_its_lines_in_the_body_but_not_in_the_subject():
    mail = MailRenderer(None).render("vc_notice", {"vc": "vision", "title": "a\nBcc: x", "message": "one\r\ntwo"})
    assert mail.subject == "Notice for VC vision: a Bcc: x"
    assert "\none\ntwo\n" in mail.body


@pytest.mark.parametrize("text, error", [("Hello\n\nbody", "must start with a line 'Subject: ...'"),
                                         ("Subject:   \n\nbody", "empty subject")])
def test_a_template_without_a_subject_line_is_an_error_naming_it(text, error):
    with pytest.raises(TemplateError, match=error):
        split_subject("x.txt.j2", text)


def test_a_long_subject_is_cut_to_one_readable_line():
    mail = split_subject("x", "Subject: " + "word " * 100 + "\n\nbody")
    assert len(mail.subject) == 200 and mail.subject.endswith("…")
