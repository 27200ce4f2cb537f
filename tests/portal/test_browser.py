"""End to end in headless Chromium (Playwright) against a live server on loopback.

A few scenarios that cover what users do every day: log in with the keyboard, submit from the form,
watch the job run and finish in the list, read and download its log, kill a running job, a VC admin
changes the policy, a user adds an SSH key and an IP. Each page visited is checked for labelled
inputs, and screenshots land in ``test-artifacts/portal/``.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from playwright.sync_api import Page, expect, sync_playwright

from dlts.models import Job, JobStatus, User, VirtualCluster, utcnow

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "portal"

# every visible form control must have a name a screen reader can read
UNLABELLED_JS = """() => Array.from(document.querySelectorAll('input, select, textarea'))
  .filter(el => el.type !== 'hidden' && el.offsetParent !== null)
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby'))
  .map(el => el.outerHTML.slice(0, 120))"""


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "the browser tests need Chromium: apt-get install chromium"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def server(live, portal_world):
    """The live server with its job manager ticking in the background, as in the demo."""
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            live.tick()
            stop.wait(0.3)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    yield live
    stop.set()
    thread.join(timeout=10)


@pytest.fixture
def new_page(browser, server):
    """Pages in fresh browser contexts; any console error (a CSP violation, a script error) fails the test."""
    contexts = []
    errors: list[str] = []

    def make(viewport=(1280, 860)) -> Page:
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True)
        context.set_default_timeout(15000)
        contexts.append(context)
        page = context.new_page()
        # a form answered 400/422 with field errors is expected; a failing script, style or fetch is not
        page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}")
                if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
        page.on("response", lambda r: errors.append(f"{r.url}: HTTP {r.status}")
                if r.status >= 400 and r.request.resource_type != "document" else None)
        page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
        return page

    yield make
    for context in contexts:
        context.close()
    assert errors == []


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def assert_labelled(page: Page) -> None:
    assert page.evaluate(UNLABELLED_JS) == [], f"unlabelled inputs on {page.url}"


def login(page: Page, base: str, user: str, password: str) -> None:
    """With the keyboard only: type, Tab, type, Enter."""
    page.goto(f"{base}/login")
    assert_labelled(page)
    page.get_by_label("User name").fill(user)
    page.keyboard.press("Tab")
    page.keyboard.type(password)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()


def status_in_list(page: Page, base: str, job_id: str, wanted: str, timeout_s: float = 30) -> None:
    """Reload the jobs list until the job shows ``wanted`` (the list is server-rendered)."""
    deadline = time.monotonic() + timeout_s
    row = page.locator(f'tr[data-job="{job_id}"]')
    while True:
        page.goto(f"{base}/jobs")
        if row.get_attribute("data-status") == wanted:
            return
        assert time.monotonic() < deadline, f"job {job_id} is {row.get_attribute('data-status')}, not {wanted}"
        time.sleep(0.5)


def submit_from_form(page: Page, base: str, command: str, name: str) -> str:
    page.goto(f"{base}/submit")
    assert_labelled(page)
    page.get_by_label("Name").first.fill(name)
    page.get_by_label("Image").fill("busybox")
    page.get_by_label("Command").fill(command)
    page.get_by_label("GPUs (per node").fill("1")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator("#job-status")).to_be_visible()
    return page.url.rsplit("/", 1)[1]


def test_researcher_submits_watches_and_downloads_the_log(new_page, server, passwords, tmp_path):
    page = new_page()
    base = server.url
    page.goto(f"{base}/login")
    shot(page, "login")
    login(page, base, "alice", passwords["alice"])
    page.goto(f"{base}/submit")
    shot(page, "submit")
    # the job holds until the test has seen it running (a fixed sleep raced the list's refresh under load)
    release = tmp_path / "release"
    job_id = submit_from_form(page, base, f"echo first line; while [ ! -e {release} ]; do sleep 0.1; done; echo training done",
                              "hello-train")
    page.goto(f"{base}/jobs")
    row = page.locator(f'tr[data-job="{job_id}"]')
    # the list refreshes itself while a job has not ended: no reload here
    expect(row).to_have_attribute("data-status", "running", timeout=30000)
    release.touch()
    expect(row).to_have_attribute("data-status", "finished", timeout=30000)
    expect(row).to_contain_text("hello-train")
    assert "1970" not in row.inner_text()
    shot(page, "jobs")
    row.get_by_role("link", name=job_id).click()
    expect(page.locator("#log")).to_contain_text("training done")
    expect(page.locator("#log-state")).to_contain_text("log complete")
    shot(page, "job-details")
    with page.expect_download() as download_info:
        page.get_by_role("button", name="Download full log").click()
    target = tmp_path / "job.log"
    download_info.value.save_as(target)
    content = target.read_text()
    assert "first line\n" in content and "training done\n" in content and content == page.locator("#log").inner_text()
    # narrow screen: the page still works and nothing needs a sideways scroll outside the tables
    narrow = new_page(viewport=(390, 844))
    login(narrow, base, "bob", passwords["bob"])
    narrow.goto(f"{base}/jobs?scope=vc")
    expect(narrow.locator(f'tr[data-job="{job_id}"]')).to_be_visible()
    shot(narrow, "jobs-narrow")


def _history(sessions) -> None:
    """A few ended and waiting jobs of bob's beside alice's, so the list shows every colour."""
    now = utcnow()
    with sessions() as s:
        bob = s.scalar(sa.select(User.id).where(User.name == "bob"))
        vision = s.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == "vision"))
        for name, status, reason, detail, ago_min in (
                ("bert-finetune", JobStatus.FINISHED, "finished", None, 90), ("sweep-lr-3e-4", JobStatus.FAILED, "exit_code",
                 "exited with code 1", 60), ("big-pretrain", JobStatus.UNAPPROVED, "user_quota",
                 "bob already holds 2 non-preemptible GPUs; a VC admin must approve", 5)):
            ended = status in (JobStatus.FINISHED, JobStatus.FAILED)
            s.add(Job(name=name, user_id=bob, vc_id=vision, type="batch", status=status, reason=reason, reason_detail=detail,
                      image="pytorch/pytorch:2.3", command="python train.py", sku="demo-gpu", gpus=2, cpu=1, memory_bytes=2**30,
                      spec={}, queue_time=now - dt.timedelta(minutes=ago_min), submitted_at=now - dt.timedelta(minutes=ago_min),
                      started_at=now - dt.timedelta(minutes=ago_min - 1) if ended else None,
                      finished_at=now - dt.timedelta(minutes=ago_min - 20) if ended else None,
                      exit_code=1 if status is JobStatus.FAILED else None))
        s.commit()


def test_kill_a_running_job_from_its_page(new_page, server, passwords, sessions):
    page = new_page()
    base = server.url
    login(page, base, "alice", passwords["alice"])
    job_id = submit_from_form(page, base, "echo started; sleep 120", "long-one")
    status_in_list(page, base, job_id, "running")
    _history(sessions)
    page.goto(f"{base}/jobs?scope=vc")
    expect(page.locator("#jobs-table tbody tr")).to_have_count(4)
    shot(page, "jobs-vc")
    page.goto(f"{base}/jobs/{job_id}")
    expect(page.locator("#log")).to_contain_text("started")  # the viewer follows the running job
    assert_labelled(page)  # the endpoint form included
    page.get_by_label("Kind", exact=True).select_option("port")
    page.get_by_label("Port the job listens on").fill("8000")
    page.get_by_role("button", name="Open endpoint").click()
    expect(page.get_by_role("status").filter(has_text="Endpoint port-8000 (port, port 8000) asked for")).to_be_visible()
    expect(page.locator("#endpoints tbody tr")).to_have_count(1)
    shot(page, "job-endpoints")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Kill").click()
    expect(page.get_by_role("status").filter(has_text="kill requested")).to_be_visible()
    status_in_list(page, base, job_id, "killed")


def test_vc_admin_changes_policy_and_user_adds_key_and_ip(new_page, server, passwords):
    base = server.url
    admin = new_page()
    login(admin, base, "vcadmin", passwords["vcadmin"])
    admin.get_by_role("link", name="VC vision").click()
    admin.get_by_role("link", name="Settings").click()
    assert_labelled(admin)
    admin.get_by_label("Scheduling policy").select_option("FIFO")
    admin.get_by_label("Notice for members").fill("GPU maintenance Friday 18:00 UTC")
    admin.get_by_role("button", name="Save settings").click()
    expect(admin.get_by_role("status").filter(has_text="Settings of VC vision saved")).to_be_visible()
    admin.get_by_role("link", name="Overview").click()
    expect(admin.locator("#vc-policy")).to_have_text("FIFO")
    shot(admin, "vc")
    admin.goto(f"{base}/cluster")
    shot(admin, "cluster")

    user = new_page()
    login(user, base, "alice", passwords["alice"])
    expect(user.get_by_text("GPU maintenance Friday 18:00 UTC")).to_be_visible()  # the VC banner
    user.goto(f"{base}/ssh-keys")
    assert_labelled(user)
    key = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    user.get_by_label("Public key").fill(f"{key} alice@laptop")
    user.get_by_role("button", name="Add key").click()
    expect(user.locator("#keys-table")).to_contain_text("SHA256:")
    shot(user, "ssh-keys")
    user.goto(f"{base}/allowed-ips")
    assert_labelled(user)
    user.get_by_role("button", name="Allow 127.0.0.1").click()
    expect(user.locator("#ips-table")).to_contain_text("127.0.0.1/32")
    user.get_by_label("Address or CIDR").fill("10.0.0.1/8")
    user.keyboard.press("Enter")
    expect(user.locator("#err-ip")).to_contain_text("did you mean 10.0.0.0/8")
    shot(user, "allowed-ips")
