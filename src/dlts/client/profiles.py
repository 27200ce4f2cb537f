"""Profiles ``dlts login`` stores: a URL and a token per name, in ``$XDG_CONFIG_HOME/dlts/profiles.yaml``
(default ``~/.config/dlts``), the directory 0700 and the file 0600. ``DLTS_URL`` and ``DLTS_TOKEN``
override the profile's values; ``--profile NAME`` or ``DLTS_PROFILE`` picks the profile."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_PROFILE = "default"


class ProfileError(Exception):
    pass


def config_dir(environ=os.environ) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dlts"


def profiles_path(environ=os.environ) -> Path:
    return config_dir(environ) / "profiles.yaml"


@dataclass(frozen=True)
class Profile:
    name: str
    url: str | None
    token: str | None
    source: str  # where the values came from, for whoami


def read_all(environ=os.environ) -> dict[str, dict]:
    path = profiles_path(environ)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path} is not valid YAML ({exc}); fix it or run `dlts login` again after removing it") from None
    profiles = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(profiles, dict):
        raise ProfileError(f"{path}: expected a mapping 'profiles: {{NAME: {{url, token}}}}'")
    return {str(k): v for k, v in profiles.items() if isinstance(v, dict)}


def _write_all(profiles: dict[str, dict], environ=os.environ) -> Path:
    directory = config_dir(environ)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    path = directory / "profiles.yaml"
    tmp = directory / f".profiles.yaml.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump({"profiles": profiles}, f, default_flow_style=False, sort_keys=True)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save(name: str, url: str, token: str, environ=os.environ) -> Path:
    profiles = read_all(environ)
    profiles[name] = {"url": url, "token": token}
    return _write_all(profiles, environ)


def remove(name: str, environ=os.environ) -> bool:
    profiles = read_all(environ)
    if name not in profiles:
        return False
    del profiles[name]
    _write_all(profiles, environ)
    return True


def resolve(name: str | None, environ=os.environ) -> Profile:
    """The URL and token to use: ``DLTS_URL``/``DLTS_TOKEN`` over the profile's stored values."""
    chosen = name or environ.get("DLTS_PROFILE") or DEFAULT_PROFILE
    stored = read_all(environ).get(chosen, {})
    url = environ.get("DLTS_URL") or stored.get("url")
    token = environ.get("DLTS_TOKEN") or stored.get("token")
    where = []
    if stored:
        where.append(f"profile {chosen!r} in {profiles_path(environ)}")
    if environ.get("DLTS_URL"):
        where.append("DLTS_URL")
    if environ.get("DLTS_TOKEN"):
        where.append("DLTS_TOKEN")
    return Profile(chosen, url, token, ", ".join(where) or "nowhere")
