"""Layered settings: defaults < file < DLTS_* environment; a bad value names its key."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from dlts.backends.k8s_settings import KubernetesSettings, PrivilegedFeature
from dlts.cli import main
from dlts.config import ConfigError, Settings, load_settings, require_production_secrets


def test_the_environment_beats_the_file_which_beats_the_defaults(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("tick_s: 5\nlisten_port: 6000\n")
    settings = load_settings(path, environ={"DLTS_LISTEN_PORT": "7000"})
    assert (settings.tick_s, settings.listen_port, settings.max_body_bytes) == (5.0, 7000, 1024 * 1024)


def test_dlts_home_holds_the_config_and_the_database(tmp_path):
    (tmp_path / "dlts.yaml").write_text("demo_gpus: 3\n")
    settings = load_settings(environ={"DLTS_HOME": str(tmp_path)})
    assert settings.demo_gpus == 3
    assert settings.effective_database_url == f"sqlite:///{tmp_path.resolve() / 'dlts.db'}"


@pytest.mark.parametrize("environ,key", [
    ({"DLTS_TICK_S": "soon"}, "DLTS_TICK_S"),
    ({"DLTS_LISTEN_PORT": "70000"}, "DLTS_LISTEN_PORT"),
    ({"DLTS_DATABASE_URL": "postgres://x"}, "DLTS_DATABASE_URL"),
    ({"DLTS_BACKEND": "slurm"}, "DLTS_BACKEND"),
])
def test_a_bad_environment_value_names_the_variable(environ, key):
    with pytest.raises(ConfigError, match=key):
        load_settings(environ=environ)


def test_an_unknown_key_in_the_file_is_refused(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("tick_seconds: 5\n")
    with pytest.raises(ConfigError, match="tick_seconds: unknown key"):
        load_settings(path, environ={})


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(path, environ={})


def test_production_needs_a_secret_key():
    settings = load_settings(environ={"DLTS_DATABASE_URL": "mysql+pymysql://u:p@h/db"})
    with pytest.raises(ConfigError, match="secret_key"):
        require_production_secrets(settings)


def test_config_check_hides_secrets_and_reports_bad_keys_without_a_traceback(tmp_path):
    runner = CliRunner()
    env = {"DLTS_HOME": str(tmp_path), "DLTS_SECRET_KEY": "0123456789abcdefXYZ",
           "DLTS_DATABASE_URL": "mysql+pymysql://dlts:hunter2@db/dlts"}
    result = runner.invoke(main, ["config", "check"], env=env)
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output and "0123456789abcdefXYZ" not in result.output
    bad = runner.invoke(main, ["config", "check"], env={"DLTS_HOME": str(tmp_path), "DLTS_TICK_S": "-1"})
    assert bad.exit_code == 1 and "DLTS_TICK_S" in bad.output and "Traceback" not in bad.output


# -- the kubernetes: section ---------------------------------------------------------------------

def test_the_kubernetes_section_is_the_backends_typed_settings(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("backend: kubernetes\nkubernetes:\n  namespace: jobs\n  watch: true\n"
                    "  storage_cidrs: [10.0.0.5, 10.1.0.0/16]\n  privileged_policy: {ml-ops: [host_ipc]}\n")
    k8s = load_settings(path, environ={}).kubernetes
    assert (k8s.namespace, k8s.watch, k8s.list_page_size) == ("jobs", True, 500)
    assert k8s.storage_cidrs == ("10.0.0.5/32", "10.1.0.0/16")
    assert k8s.features_for("ml-ops") == {PrivilegedFeature.HOST_IPC} and k8s.features_for("vision") == set()


def test_an_empty_kubernetes_section_means_every_default(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("kubernetes:\n")
    assert load_settings(path, environ={}).kubernetes == KubernetesSettings()


def test_the_environment_sets_single_keys_of_the_section_over_the_file(tmp_path):
    path = tmp_path / "dlts.yaml"
    path.write_text("kubernetes:\n  namespace: jobs\n  list_page_size: 100\n")
    k8s = load_settings(path, environ={"DLTS_KUBERNETES__LIST_PAGE_SIZE": "50", "DLTS_KUBERNETES__WATCH": "true",
                                       "DLTS_KUBERNETES__PRIVILEGED_POLICY": '{"*": [run_as_root]}'}).kubernetes
    assert (k8s.namespace, k8s.list_page_size, k8s.watch) == ("jobs", 50, True)
    assert k8s.features_for("any") == {PrivilegedFeature.RUN_AS_ROOT}


@pytest.mark.parametrize("text,message", [
    ("kubernetes:\n  namespce: jobs\n", "kubernetes.namespce: unknown key"),
    ("kubernetes:\n  namespace: Jobs_1\n", "kubernetes.namespace: Value error, must be a Kubernetes namespace name"),
    ("kubernetes:\n  list_page_size: 1\n", "kubernetes.list_page_size: Input should be greater than or equal to 10"),
    ("kubernetes:\n  storage_cidrs: [10.0.0.1/8]\n", "kubernetes.storage_cidrs: Value error, '10.0.0.1/8' is not"),
    ("kubernetes:\n  privileged_policy: {ml: [fly]}\n", "VC 'ml': features must be a list of privileged, host_network"),
    ("kubernetes:\n  init_image: 'busy box'\n", "kubernetes.init_image: Value error, must be an image reference"),
    ("kubernetes:\n  context: admin\n", "context needs kubeconfig"),
    ("kubernetes:\n  priority_class: dlts-x\n  preemptible_priority_class: dlts-x\n", "must differ"),
    ("kubernetes:\n  backoff_initial_s: 90\n", "backoff_initial_s (90.0) must not exceed backoff_max_s (60.0)"),
    ("kubernetes: [namespace]\n", "kubernetes: Input should be a valid dictionary"),
])
def test_a_bad_kubernetes_value_names_its_dotted_key(tmp_path, text, message):
    path = tmp_path / "dlts.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_settings(path, environ={})
    assert message in str(exc.value)


def test_a_bad_kubernetes_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="DLTS_KUBERNETES__WATCH: Input should be a valid boolean"):
        load_settings(environ={"DLTS_KUBERNETES__WATCH": "sometimes"})


@pytest.mark.parametrize("old,new", [
    ("namespace: dlts", "kubernetes.namespace"), ("kubeconfig: /etc/dlts/kubeconfig", "kubernetes.kubeconfig"),
    ("node_label_sku: dlts.io/sku", "kubernetes.sku_label"), ("node_label_vc: x/vc", "kubernetes.vc_label"),
])
def test_a_key_that_moved_into_the_section_says_where_it_went(tmp_path, old, new):
    path = tmp_path / "dlts.yaml"
    path.write_text(old + "\n")
    with pytest.raises(ConfigError, match=f"moved into the kubernetes: section, write it as {new}"):
        load_settings(path, environ={})


def test_node_lost_after_s_has_one_default_for_both_backends():
    settings = load_settings(environ={})
    assert settings.node_lost_after_s == 300.0
    assert "node_lost_after_s" not in KubernetesSettings.model_fields


def test_config_check_prints_the_kubernetes_section(tmp_path):
    (tmp_path / "dlts.yaml").write_text("kubernetes:\n  namespace: jobs\n  kubeconfig: /etc/dlts/kubeconfig\n"
                                        "  privileged_policy: {ml-ops: [privileged, host_ipc]}\n")
    result = CliRunner().invoke(main, ["config", "check"], env={"DLTS_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    section = lines[lines.index("kubernetes:") + 1:]
    section = section[:next(i for i, line in enumerate(section) if not line.startswith("  "))]
    assert {line.split(":", 1)[0].strip() for line in section} == set(KubernetesSettings.model_fields)
    assert "  namespace: jobs" in section and "  kubeconfig: /etc/dlts/kubeconfig" in section
    assert '  privileged_policy: {"ml-ops": ["host_ipc", "privileged"]}' in section
    assert "  watch: false" in section and "  context: null" in section


def test_docs_list_every_kubernetes_key_and_show_its_real_defaults():
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text[text.index("\n## kubernetes\n"):]
    table = {key for row in re.findall(r"^\| (`[^|]+`) \|", section, re.MULTILINE) for key in re.findall(r"`(\w+)`", row)}
    assert table == set(KubernetesSettings.model_fields)
    shown = section[section.index("as `dlts config check` prints it:"):]
    start = shown.index("```yaml\n") + len("```yaml\n")
    block = shown[start:shown.index("\n```", start)]
    assert yaml.safe_load(block)["kubernetes"] == KubernetesSettings().model_dump(mode="json")


def test_the_config_chooses_a_scheduler_profile_by_name() -> None:
    assert Settings(scheduler_profile="no_reclaim").scheduler_profile == "no_reclaim"
    assert Settings().scheduler_profile == "default"
    with pytest.raises(ValidationError, match="unknown scheduler profile 'fastest'"):
        Settings(scheduler_profile="fastest")
