"""The layers of dlts.yaml without its models: where the file is, reading it, the ``DLTS_*`` variables
of a section, and the one-line error that names each bad key and where it came from.

``dlts.config`` builds the whole ``Settings`` from these; a command that needs one section only
(``dlts storage scan`` of a path outside ``storage.roots``) builds that section with ``load_section``
and so does not import, or build the pydantic models of, every other section (~0.07 s of CPU at
every start, docs/benchmarks.md, *Storage scan*). This module imports neither pydantic nor yaml (yaml
loads when there is a file to read).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    Model = TypeVar("Model", bound=BaseModel)

ENV_PREFIX = "DLTS_"
SYSTEM_CONFIG = Path("/etc/dlts/dlts.yaml")

# Keys that moved into the kubernetes: section (an old file is refused with the new name).
MOVED_KEYS = {
    "kubeconfig": "kubernetes.kubeconfig",
    "namespace": "kubernetes.namespace",
    "node_label_sku": "kubernetes.sku_label",
    "node_label_ib_domain": "kubernetes.ib_domain_label",
    "node_label_vc": "kubernetes.vc_label",
}


class ConfigError(Exception):
    """Start-up refused: the message names the key and says what is wrong."""


def config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    if explicit:
        return Path(explicit)
    if environ.get("DLTS_CONFIG"):
        return Path(environ["DLTS_CONFIG"])
    if environ.get("DLTS_HOME"):
        candidate = Path(environ["DLTS_HOME"]) / "dlts.yaml"
        return candidate if candidate.exists() else None
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of key: value")
    return data


def section_from_env(name: str, keys: Mapping[str, str], environ: Mapping[str, str],
                     values: dict[str, Any], origins: dict[str, str]) -> None:
    """The keys of section ``name`` that the environment sets one by one (``DLTS_STORAGE__SCAN_INTERVAL_S``):
    ``keys`` maps each key in capitals to its name. Adds them to ``values[name]`` and, for each dotted
    key, the variable it came from to ``origins``."""
    prefix = f"{ENV_PREFIX}{name.upper()}__"
    for key, raw in environ.items():
        if key.startswith(prefix) and key[len(prefix):] in keys:
            subkey = keys[key[len(prefix):]]
            values.setdefault(name, {})[subkey] = raw
            origins[f"{name}.{subkey}"] = key


def merge_section(file_value: Any, from_env: dict[str, Any]) -> dict[str, Any]:
    """The environment sets single keys of the file's section (a section that is not a mapping is replaced)."""
    return {**(file_value if isinstance(file_value, dict) else {}), **from_env}


def invalid(exc: ValidationError, origins: Mapping[str, str], path: Path | None,
            loc_prefix: tuple[str, ...] = ()) -> ConfigError:
    """One ``ConfigError`` naming every bad key (or the variable it came from) and what is wrong."""
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in (*loc_prefix, *err["loc"])) or "?"
        origin = origins.get(key, key)
        if err["type"] == "extra_forbidden" and key in MOVED_KEYS:
            problems.append(f"{origin}: moved into the kubernetes: section, write it as {MOVED_KEYS[key]}")
        elif err["type"] == "extra_forbidden":
            problems.append(f"{origin}: unknown key (known keys: see docs/configuration.md)")
        else:
            problems.append(f"{origin}: {err['msg']} (got {err.get('input')!r})")
    where = f" in {path}" if path is not None else ""
    return ConfigError(f"invalid configuration{where}: " + "; ".join(problems))


def load_section(name: str, model: type[Model], config_file: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> Model:
    """The section ``name`` of the settings alone, from the same file and ``DLTS_<NAME>__*`` variables
    as ``dlts.config.load_settings`` (equal to its ``Settings().<name>``). Only this section is
    validated: a bad key elsewhere in the file is not reported (``dlts config check`` does that)."""
    from pydantic import ValidationError

    environ = os.environ if environ is None else environ
    path = config_path(config_file, environ)
    value = read_file(path).get(name) if path is not None else None
    from_env: dict[str, Any] = {}
    origins: dict[str, str] = {}
    section_from_env(name, {key.upper(): key for key in model.model_fields}, environ, from_env, origins)
    if name in from_env:
        value = merge_section(value, from_env[name])
    try:
        return model.model_validate({} if value is None else value)  # "storage:" with nothing under it: defaults
    except ValidationError as exc:
        raise invalid(exc, origins, path, (name,)) from None
