"""The notifier against a real SMTP server on loopback (aiosmtpd): what arrives, TLS and AUTH, dedup,
the rate limit, outages, refusals, header injection and operator templates."""

from __future__ import annotations

import datetime as dt
import socket

import pytest
import sqlalchemy as sa

from dlts.errors import InvalidInput
from dlts.managers.notify import NotifyManager, backoff_s
from dlts.models import OutboxMessage, OutboxStatus, utcnow
from dlts.services import notify

from .conftest import SMTP_USER, check_login, with_notify

NODE = {"node": "g017", "reason": "GPU 3: uncorrectable ECC errors", "state": "quarantined", "step": "reset_gpu",
        "cycle_id": 12, "findings": ["GPU 3 dbe_volatile=2", "XID 48 on GPU 3"]}
JOB = {"job_id": 41, "job_name": "resnet-50", "vc": "vision", "user": "alice", "node": "g017",
       "message": "node g017 GPU 3 has uncorrectable ECC errors; your job was stopped and requeued at the head of its queue"}


class Clock:
    def __init__(self) -> None:
        self.now = utcnow() + dt.timedelta(seconds=5)  # rows queued by the test are due

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def queue(sessions, template="node_out_of_service", to=("admin@example.org",), context=NODE, **kwargs):
    with sessions() as s:
        row_id = notify.enqueue(s, template=template, to=list(to), context=context, **kwargs)
        s.commit()
    return row_id


def row(sessions, row_id) -> OutboxMessage:
    with sessions() as s:
        return s.get(OutboxMessage, row_id)


def manager(sessions, settings, clock=None, **notify_settings) -> NotifyManager:
    return NotifyManager(sessions, with_notify(settings, **notify_settings), clock=clock or Clock())


def test_a_queued_notice_arrives_with_its_headers_body_and_recipients(sessions, settings, smtp_server):
    row_id = queue(sessions, to=["admin@example.org", "oncall@example.org"])
    result = manager(sessions, settings, smtp_port=smtp_server.port, portal_url="https://dlts.example.org").run_once()

    assert result.sent == 1
    [got] = smtp_server.received
    assert got.mail_from == "dlts@cluster.example.org"
    assert got.rcpt_tos == ["admin@example.org", "oncall@example.org"]
    message = got.message
    assert message["Subject"] == "[DLTS] Node g017 left service: GPU 3: uncorrectable ECC errors"
    assert message["From"] == "dlts@cluster.example.org"
    assert message["To"] == "admin@example.org, oncall@example.org"
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["X-DLTS-Notice"] == "node_out_of_service"
    assert message["Message-ID"].startswith(f"<dlts.notify.{row_id}.") and message["Message-ID"].endswith("@cluster.example.org>")
    assert message["Date"]
    body = got.body
    assert "Node:     g017" in body and "State:    quarantined" in body and "Repair cycle: 12" in body
    assert "  - GPU 3 dbe_volatile=2\n  - XID 48 on GPU 3\n" in body
    assert "https://dlts.example.org/cluster" in body
    assert message.get_content_type() == "text/plain" and message.get_content_charset() == "utf-8"
    done = row(sessions, row_id)
    assert done.status is OutboxStatus.SENT and done.sent_at is not None and done.attempts == 1 and done.last_error is None


def test_every_template_the_repair_manager_uses_arrives(sessions, settings, smtp_server):
    for template in ("node_out_of_service", "node_escalated", "node_needs_human"):
        queue(sessions, template=template)
    queue(sessions, template="job_stopped_for_repair", to=["alice@example.org"], context=JOB)
    queue(sessions, template="vc_notice", to=["bob@example.org"], context={"vc": "vision", "message": "Maintenance on Friday."})

    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().sent == 5
    subjects = [r.message["Subject"] for r in smtp_server.received]
    assert subjects == [
        "[DLTS] Node g017 left service: GPU 3: uncorrectable ECC errors",
        "[DLTS] Node g017 escalated to reset_gpu: GPU 3: uncorrectable ECC errors",
        "[DLTS] Node g017 needs a person: GPU 3: uncorrectable ECC errors",
        "[DLTS] Job 41 (resnet-50) was stopped for a node repair",
        "[DLTS] Notice for VC vision",
    ]
    job_mail = smtp_server.received[3]
    assert job_mail.rcpt_tos == ["alice@example.org"]
    assert JOB["message"] in job_mail.body and "Hello alice," in job_mail.body
    assert "dlts node return g017" in smtp_server.received[2].body


def test_starttls_and_auth_with_a_password_from_a_file(sessions, settings, certificate, password_file, down_smtp_server):
    server = down_smtp_server.start(tls_context=certificate.server_context(), require_starttls=True,
                                    auth_required=True, authenticator=check_login)
    queue(sessions)
    notifier = manager(sessions, settings, smtp_port=server.port, security="starttls",
                       tls_ca_file=str(certificate.cert_file), username=SMTP_USER, password_file=str(password_file))
    notifier.check()
    assert notifier.run_once().sent == 1
    [got] = server.received
    assert got.tls and got.login == SMTP_USER


def test_a_wrong_password_keeps_the_notice_queued_and_says_why(sessions, settings, certificate, tmp_path, down_smtp_server):
    server = down_smtp_server.start(tls_context=certificate.server_context(), require_starttls=True,
                                    auth_required=True, authenticator=check_login)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password\n")
    row_id = queue(sessions)
    result = manager(sessions, settings, smtp_port=server.port, security="starttls", tls_ca_file=str(certificate.cert_file),
                     username=SMTP_USER, password_file=str(wrong)).run_once()
    assert result.sent == 0 and "login to 127.0.0.1" in (result.unreachable or "")
    kept = row(sessions, row_id)
    assert kept.status is OutboxStatus.QUEUED and kept.attempts == 0 and "refused" in kept.last_error
    assert "not-the-password" not in kept.last_error and not server.received


def test_an_untrusted_certificate_is_refused(sessions, settings, certificate, down_smtp_server):
    server = down_smtp_server.start(tls_context=certificate.server_context(), require_starttls=True)
    row_id = queue(sessions)  # no tls_ca_file: the system CAs do not know the test's certificate
    result = manager(sessions, settings, smtp_port=server.port, security="starttls").run_once()
    assert result.sent == 0 and "TLS with 127.0.0.1" in (result.unreachable or "")
    assert row(sessions, row_id).status is OutboxStatus.QUEUED and not server.received


def test_implicit_tls_on_the_smtps_port(sessions, settings, certificate, down_smtp_server):
    server = down_smtp_server.start(ssl_context=certificate.server_context())
    queue(sessions)
    assert manager(sessions, settings, smtp_port=server.port, security="ssl",
                   tls_ca_file=str(certificate.cert_file)).run_once().sent == 1
    assert server.received[0].tls


def test_starttls_not_offered_is_not_silently_sent_in_clear(sessions, settings, smtp_server):
    row_id = queue(sessions)
    result = manager(sessions, settings, smtp_port=smtp_server.port, security="starttls").run_once()
    assert "does not offer STARTTLS" in (result.unreachable or "")
    assert row(sessions, row_id).status is OutboxStatus.QUEUED and not smtp_server.received


def test_a_refused_connection_leaves_the_notice_queued_and_a_later_run_sends_it(sessions, settings, down_smtp_server):
    clock = Clock()
    row_id = queue(sessions)
    notifier = manager(sessions, settings, clock, smtp_port=down_smtp_server.port)

    first = notifier.run_once()
    assert first.sent == 0 and "cannot use the mail server" in first.unreachable
    kept = row(sessions, row_id)
    assert kept.status is OutboxStatus.QUEUED and kept.attempts == 0 and "refused" in kept.last_error.lower()

    down_smtp_server.start()
    clock.advance(1)
    assert notifier.run_once().sent == 0, "the notifier waits its back-off before connecting again"
    clock.advance(backoff_s(notifier.settings, 1))
    assert notifier.run_once().sent == 1
    assert row(sessions, row_id).status is OutboxStatus.SENT
    assert [r.rcpt_tos for r in down_smtp_server.received] == [["admin@example.org"]]


def test_a_server_that_never_answers_times_out_and_the_notice_waits(sessions, settings):
    with socket.socket() as silent:  # accepts connections (backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        row_id = queue(sessions)
        result = manager(sessions, settings, smtp_port=silent.getsockname()[1], timeout_s=0.5).run_once()
    assert result.sent == 0 and result.unreachable
    assert row(sessions, row_id).status is OutboxStatus.QUEUED


def test_one_connection_carries_every_due_notice_of_a_run(sessions, settings, smtp_server):
    connections = []

    def counting(notify_settings):
        from dlts.managers.notify import connect_smtp

        connections.append(1)
        return connect_smtp(notify_settings)

    for n in range(4):
        queue(sessions, to=[f"admin{n}@example.org"])
    notifier = NotifyManager(sessions, with_notify(settings, smtp_port=smtp_server.port), smtp_factory=counting)
    assert notifier.run_once().sent == 4
    assert len(connections) == 1 and len(smtp_server.received) == 4
    assert notifier.run_once().sent == 0 and len(connections) == 1, "nothing due: no connection at all"


def test_the_same_dedup_key_within_the_window_is_one_mail(sessions, settings, smtp_server):
    first = queue(sessions, dedup_key="node_out_of_service:g017")
    assert queue(sessions, dedup_key="node_out_of_service:g017") is None
    other = queue(sessions, dedup_key="node_out_of_service:g018", context=NODE | {"node": "g018"})
    assert first and other
    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().sent == 2
    assert [r.message["Subject"].split()[2] for r in smtp_server.received] == ["g017", "g018"]
    assert queue(sessions, dedup_key="node_out_of_service:g017") is None, "sent within the window: still a duplicate"


def test_the_sender_drops_a_duplicate_that_two_writers_raced_in(sessions, settings, smtp_server):
    first = queue(sessions, dedup_key="k")
    with sessions() as s:  # a second writer that did not see the first row (as in a race)
        s.add(OutboxMessage(template="node_out_of_service", recipients=["admin@example.org"], context=NODE,
                            dedup_key="k", status=OutboxStatus.QUEUED, attempts=0, next_attempt_at=utcnow(),
                            created_at=utcnow()))
        s.commit()
        second = s.scalar(sa.select(sa.func.max(OutboxMessage.id)))
    result = manager(sessions, settings, smtp_port=smtp_server.port).run_once()
    assert (result.sent, result.duplicates) == (1, 1) and len(smtp_server.received) == 1
    assert row(sessions, first).status is OutboxStatus.SENT
    assert row(sessions, second).status is OutboxStatus.DUPLICATE


def test_a_notice_after_the_dedup_window_goes_out_again(sessions, settings, smtp_server):
    with sessions() as s:  # sent two hours ago; the window is one hour
        s.add(OutboxMessage(template="node_out_of_service", recipients=["admin@example.org"], context=NODE, dedup_key="k",
                            status=OutboxStatus.SENT, attempts=1, next_attempt_at=utcnow() - dt.timedelta(hours=2),
                            created_at=utcnow() - dt.timedelta(hours=2), sent_at=utcnow() - dt.timedelta(hours=2)))
        s.commit()
    again = queue(sessions, dedup_key="k")
    assert again is not None
    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().sent == 1
    assert row(sessions, again).status is OutboxStatus.SENT


def test_a_failed_notice_does_not_hold_back_the_next_one_with_its_key(sessions, settings):
    with sessions() as s:
        s.add(OutboxMessage(template="node_out_of_service", recipients=["admin@example.org"], context=NODE, dedup_key="k",
                            status=OutboxStatus.FAILED, attempts=10, next_attempt_at=utcnow(), created_at=utcnow()))
        s.commit()
    assert queue(sessions, dedup_key="k") is not None


def test_over_the_rate_limit_a_notice_waits_and_is_sent_when_the_hour_frees_up(sessions, settings, smtp_server):
    clock = Clock()
    notifier = manager(sessions, settings, clock, smtp_port=smtp_server.port, rate_limit_per_hour=2)
    ids = [queue(sessions, context=NODE | {"node": f"g{n}"}) for n in range(3)]
    other = queue(sessions, to=["someone-else@example.org"])

    result = notifier.run_once()
    assert (result.sent, result.rate_limited) == (3, 1)
    assert [r.rcpt_tos for r in smtp_server.received] == [["admin@example.org"]] * 2 + [["someone-else@example.org"]]
    waiting = row(sessions, ids[2])
    assert waiting.status is OutboxStatus.QUEUED and waiting.attempts == 0
    assert waiting.next_attempt_at == clock.now + dt.timedelta(hours=1) and "rate limited" in waiting.last_error
    assert row(sessions, other).status is OutboxStatus.SENT

    clock.advance(1800)
    assert notifier.run_once().sent == 0, "not due yet"
    clock.advance(1800)
    assert notifier.run_once().sent == 1
    assert row(sessions, ids[2]).status is OutboxStatus.SENT
    assert "g2" in smtp_server.received[-1].message["Subject"]


def test_the_rate_limit_counts_addresses_case_insensitively_and_across_runs(sessions, settings, smtp_server):
    clock = Clock()
    queue(sessions, to=["Admin@Example.org"])
    assert manager(sessions, settings, clock, smtp_port=smtp_server.port, rate_limit_per_hour=1).run_once().sent == 1
    queue(sessions, to=["admin@example.org"])
    later = manager(sessions, settings, clock, smtp_port=smtp_server.port, rate_limit_per_hour=1)  # a new process
    assert later.run_once().rate_limited == 1 and len(smtp_server.received) == 1


def test_a_subject_value_with_line_breaks_cannot_add_a_header_or_a_recipient(sessions, settings, smtp_server):
    hostile = JOB | {"job_name": "x\r\nBcc: evil@attacker.example\r\n\r\nforged body"}
    queue(sessions, template="job_stopped_for_repair", to=["alice@example.org"], context=hostile)
    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().sent == 1
    [got] = smtp_server.received
    assert got.rcpt_tos == ["alice@example.org"]
    assert got.message["Bcc"] is None and got.message.get_all("To") == ["alice@example.org"]
    assert got.message["Subject"] == "[DLTS] Job 41 (x Bcc: evil@attacker.example forged body) was stopped for a node repair"


@pytest.mark.parametrize("address", ["alice@example.org\r\nBcc: evil@attacker.example", "Alice <alice@example.org>",
                                     "alice@example.org, evil@attacker.example", "not-an-address", "a b@example.org"])
def test_an_address_that_could_inject_a_header_or_recipient_is_refused(sessions, address):
    with sessions() as s, pytest.raises(InvalidInput, match="not a plain e-mail address"):
        notify.enqueue(s, template="node_out_of_service", to=[address], context=NODE)


def test_a_row_with_a_bad_address_written_around_enqueue_fails_and_is_not_sent(sessions, settings, smtp_server):
    with sessions() as s:
        s.add(OutboxMessage(template="node_out_of_service", recipients=["a@example.org\nBcc: evil@attacker.example"],
                            context=NODE, status=OutboxStatus.QUEUED, attempts=0, next_attempt_at=utcnow(), created_at=utcnow()))
        s.commit()
    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().failed == 1
    assert not smtp_server.received


def test_an_operator_template_in_templates_dir_replaces_the_packaged_one(sessions, settings, smtp_server, tmp_path):
    override = tmp_path / "operator-templates" / "email"
    override.mkdir(parents=True)
    (override / "node_out_of_service.txt.j2").write_text(
        "Subject: ACME cluster: {{ node }} is out\n\nCall the ACME hotline about {{ node }} ({{ reason }}).\n"
        "{% include '_footer.txt.j2' %}")
    (override / "_footer.txt.j2").write_text("-- ACME operations\n")
    queue(sessions)
    queue(sessions, template="node_escalated")  # not overridden: the packaged one, with the operator's footer
    custom = settings.model_copy(update={"templates_dir": override.parent})
    assert manager(sessions, custom, smtp_port=smtp_server.port, subject_prefix="").run_once().sent == 2
    first, second = smtp_server.received
    assert first.message["Subject"] == "ACME cluster: g017 is out"
    assert first.body == "Call the ACME hotline about g017 (GPU 3: uncorrectable ECC errors).\n-- ACME operations\n"
    assert second.message["Subject"].startswith("Node g017 escalated")
    assert second.body.endswith("-- ACME operations\n")


def test_a_broken_operator_template_is_retried_with_back_off_then_failed_and_kept(sessions, settings, smtp_server, tmp_path):
    override = tmp_path / "t" / "email"
    override.mkdir(parents=True)
    (override / "node_out_of_service.txt.j2").write_text("Subject: {{ no_such_key }}\n\nbody\n")
    clock = Clock()
    row_id = queue(sessions)
    notifier = manager(sessions, settings.model_copy(update={"templates_dir": override.parent}), clock,
                       smtp_port=smtp_server.port, max_attempts=2, retry_initial_s=60)
    assert notifier.run_once().retried == 1
    kept = row(sessions, row_id)
    assert kept.status is OutboxStatus.QUEUED and kept.attempts == 1 and "no_such_key" in kept.last_error
    assert kept.next_attempt_at == clock.now + dt.timedelta(seconds=60)
    clock.advance(60)
    assert notifier.run_once().failed == 1
    failed = row(sessions, row_id)
    assert failed.status is OutboxStatus.FAILED and failed.attempts == 2 and "gave up after 2 tries" in failed.last_error
    assert not smtp_server.received


def test_a_temporary_refusal_backs_off_and_a_permanent_one_fails_at_once(sessions, settings, smtp_server):
    clock = Clock()
    smtp_server.handler.rcpt_reply = lambda address: {
        "busy@example.org": "450 4.2.1 Mailbox busy, try later", "gone@example.org": "550 5.1.1 No such user"}.get(address)
    busy = queue(sessions, to=["busy@example.org"])
    gone = queue(sessions, to=["gone@example.org"])
    notifier = manager(sessions, settings, clock, smtp_port=smtp_server.port, retry_initial_s=60, retry_max_s=100)
    result = notifier.run_once()
    assert (result.retried, result.failed, result.sent) == (1, 1, 0)
    assert row(sessions, gone).status is OutboxStatus.FAILED and "550" in row(sessions, gone).last_error
    waiting = row(sessions, busy)
    assert waiting.status is OutboxStatus.QUEUED and "450" in waiting.last_error
    assert waiting.next_attempt_at == clock.now + dt.timedelta(seconds=60)

    clock.advance(60)
    assert notifier.run_once().retried == 1
    assert row(sessions, busy).next_attempt_at == clock.now + dt.timedelta(seconds=100), "doubled, capped at retry_max_s"

    smtp_server.handler.rcpt_reply = lambda address: None
    clock.advance(100)
    assert notifier.run_once().sent == 1
    assert row(sessions, busy).attempts == 3


def test_one_refused_recipient_of_several_does_not_hold_back_the_others(sessions, settings, smtp_server):
    smtp_server.handler.rcpt_reply = lambda address: "550 5.1.1 No such user" if address == "gone@example.org" else None
    row_id = queue(sessions, to=["admin@example.org", "gone@example.org"])
    assert manager(sessions, settings, smtp_port=smtp_server.port).run_once().sent == 1
    assert smtp_server.received[0].rcpt_tos == ["admin@example.org"]
    assert "gone@example.org 550" in row(sessions, row_id).last_error


def test_the_server_refusing_the_sender_keeps_every_notice_queued(sessions, settings, smtp_server):
    async def refuse_sender(server, session, envelope, address, mail_options):
        return "553 5.7.1 Sender not allowed"

    smtp_server.handler.handle_MAIL = refuse_sender
    ids = [queue(sessions), queue(sessions, template="node_escalated")]
    result = manager(sessions, settings, smtp_port=smtp_server.port).run_once()
    assert result.failed == 0 and "check notify.from_address" in result.unreachable
    assert [row(sessions, i).status for i in ids] == [OutboxStatus.QUEUED, OutboxStatus.QUEUED]


def test_off_without_an_smtp_host_nothing_is_sent_and_notices_stay_queued(sessions, settings, smtp_server):
    row_id = queue(sessions)
    notifier = NotifyManager(sessions, settings)  # the test settings have no notify section
    assert not notifier.settings.is_enabled
    assert notifier.run_once().sent == 0
    assert row(sessions, row_id).status is OutboxStatus.QUEUED and not smtp_server.received


def test_finished_rows_older_than_keep_days_are_purged_and_queued_ones_kept(sessions, settings, smtp_server):
    old = utcnow() - dt.timedelta(days=40)
    with sessions() as s:
        for status in (OutboxStatus.SENT, OutboxStatus.FAILED, OutboxStatus.DUPLICATE, OutboxStatus.QUEUED):
            s.add(OutboxMessage(template="node_out_of_service", recipients=["a@example.org"], context=NODE,
                                status=status, attempts=1, next_attempt_at=utcnow() + dt.timedelta(days=1), created_at=old))
        s.commit()
    fresh = queue(sessions)
    result = manager(sessions, settings, smtp_port=smtp_server.port, keep_days=30).run_once()
    assert result.purged == 3
    with sessions() as s:
        left = {(r.status, r.id == fresh) for r in s.scalars(sa.select(OutboxMessage))}
    assert left == {(OutboxStatus.QUEUED, False), (OutboxStatus.SENT, True)}
