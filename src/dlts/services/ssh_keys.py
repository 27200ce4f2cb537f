"""SSH public keys of a user (global keys, injected into every job): parse, validate, fingerprint.

Keys are parsed with ``cryptography`` (OpenSSH format ``TYPE BASE64 [comment]``). Accepted:
ed25519, ECDSA (256/384/521) and RSA of 2048 bits or more; DSA and short RSA keys are refused. The
fingerprint is OpenSSH's ``SHA256:`` form, so users can compare it with ``ssh-keygen -lf``. The same
key twice for one user is refused, and so is a key already registered to another user (a key names
one person).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from sqlalchemy.orm import Session

from dlts.errors import InvalidInput, NotFound, Refused, WrongState
from dlts.models import SshKey, iso
from dlts.services.auth import Principal
from dlts.services.transaction import transaction, transactional

MAX_KEYS_PER_USER = 50
MAX_KEY_CHARS = 16 * 1024
MIN_RSA_BITS = 2048
MAX_RSA_BITS = 16384
KNOWN_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")


@dataclass(frozen=True)
class SshKeyView:
    id: int
    name: str
    key_type: str
    bits: int | None
    fingerprint: str
    public_key: str
    created_at: str | None


@dataclass(frozen=True)
class ParsedKey:
    key_type: str
    bits: int
    fingerprint: str
    normalized: str  # "TYPE BASE64 comment" without surrounding whitespace
    comment: str


def fingerprint_sha256(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def parse_public_key(text: str) -> ParsedKey:
    """Validate one OpenSSH public key line; raises InvalidInput/Refused with what to do instead."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("public_key is empty; paste the contents of your ~/.ssh/id_ed25519.pub.", details={"field": "public_key"})
    if len(text) > MAX_KEY_CHARS:
        raise InvalidInput(f"public_key is longer than {MAX_KEY_CHARS} characters; paste one public key line.",
                           details={"field": "public_key"})
    line = text.strip()
    if "\n" in line or "\r" in line:
        raise InvalidInput("public_key must be one line (one key); add several keys one by one.", details={"field": "public_key"})
    if "PRIVATE KEY" in line:
        raise InvalidInput("This is a private key. Never share it: paste the .pub file instead.", code="private_key",
                           details={"field": "public_key"})
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in KNOWN_TYPES:
        shown = parts[0][:40] if parts else ""
        if shown == "ssh-dss":
            raise Refused("DSA keys are not accepted (weak, disabled by OpenSSH). Create an ed25519 key with `ssh-keygen -t ed25519`.",
                          code="weak_ssh_key", details={"field": "public_key"})
        raise InvalidInput(f"public_key must look like 'ssh-ed25519 AAAA... comment'; key type {shown!r} is not one of "
                           f"{', '.join(KNOWN_TYPES)}.", code="invalid_ssh_key", details={"field": "public_key"})
    key_type, b64 = parts[0], parts[1]
    comment = parts[2].strip() if len(parts) > 2 else ""
    try:
        blob = base64.b64decode(b64, validate=True)
        key = load_ssh_public_key(f"{key_type} {b64}".encode())
    except (binascii.Error, ValueError, TypeError):
        raise InvalidInput("public_key could not be parsed: the base64 part is damaged or does not match the key type. "
                           "Copy the whole line of the .pub file again.", code="invalid_ssh_key", details={"field": "public_key"}) from None
    except Exception:  # noqa: BLE001 - cryptography raises UnsupportedAlgorithm for odd curves
        raise InvalidInput("public_key uses an unsupported algorithm; use ed25519, ECDSA or RSA (2048+ bits).",
                           code="invalid_ssh_key", details={"field": "public_key"}) from None
    if isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < MIN_RSA_BITS:
            raise Refused(f"This RSA key has {bits} bits; at least {MIN_RSA_BITS} are required. Create an ed25519 key "
                          "with `ssh-keygen -t ed25519`.",
                          code="weak_ssh_key", details={"field": "public_key", "bits": bits, "min_bits": MIN_RSA_BITS})
        if bits > MAX_RSA_BITS:
            raise InvalidInput(f"This RSA key has {bits} bits; at most {MAX_RSA_BITS} are accepted.", code="invalid_ssh_key",
                               details={"field": "public_key"})
    elif isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    elif isinstance(key, ec.EllipticCurvePublicKey):
        bits = key.curve.key_size
    else:
        raise InvalidInput("public_key uses an unsupported algorithm; use ed25519, ECDSA or RSA (2048+ bits).",
                           code="invalid_ssh_key", details={"field": "public_key"})
    if comment and (len(comment) > 256 or not comment.isprintable()):
        raise InvalidInput("The key's comment must be printable and at most 256 characters.", details={"field": "public_key"})
    normalized = f"{key_type} {b64}" + (f" {comment}" if comment else "")
    return ParsedKey(key_type, bits, fingerprint_sha256(blob), normalized, comment)


def _view(row: SshKey) -> SshKeyView:
    return SshKeyView(row.id, row.name, row.key_type, row.bits, row.fingerprint, row.public_key, iso(row.created_at))


def list_keys(session: Session, principal: Principal) -> list[SshKeyView]:
    rows = session.scalars(sa.select(SshKey).where(SshKey.user_id == principal.user_id).order_by(SshKey.id))
    return [_view(r) for r in rows]


def add_key(session: Session, principal: Principal, public_key: str, name: str | None = None) -> SshKeyView:
    with transaction(session):
        parsed = parse_public_key(public_key)
        label = (name or parsed.comment or parsed.key_type)[:128]
        if name is not None and (not name.strip() or len(name) > 128 or not name.isprintable()):
            raise InvalidInput("name must be printable text of 1-128 characters.", details={"field": "name"})
        owner = session.scalar(sa.select(SshKey.user_id).where(SshKey.fingerprint == parsed.fingerprint).limit(1))
        if owner == principal.user_id:
            raise WrongState(f"You already have this key ({parsed.fingerprint}).", code="duplicate_ssh_key",
                             details={"fingerprint": parsed.fingerprint})
        if owner is not None:
            raise WrongState(f"This key ({parsed.fingerprint}) is registered to another user; a key names one person. "
                             "Create a key of your own with `ssh-keygen -t ed25519`.", code="duplicate_ssh_key",
                             details={"fingerprint": parsed.fingerprint})
        count = session.execute(sa.select(sa.func.count(SshKey.id)).where(SshKey.user_id == principal.user_id)).scalar_one()
        if count >= MAX_KEYS_PER_USER:
            raise Refused(f"You have {count} SSH keys, the most allowed is {MAX_KEYS_PER_USER}; delete one first.",
                          code="too_many_ssh_keys", details={"max": MAX_KEYS_PER_USER})
        row = SshKey(user_id=principal.user_id, name=label, key_type=parsed.key_type, bits=parsed.bits,
                     public_key=parsed.normalized, fingerprint=parsed.fingerprint)
        session.add(row)
    return _view(row)


@transactional
def delete_key(session: Session, principal: Principal, key_id: int) -> None:
    row = session.get(SshKey, key_id)
    if row is None or row.user_id != principal.user_id:
        raise NotFound(f"You have no SSH key with id {key_id}.", code="ssh_key_not_found")
    session.delete(row)


def keys_of_user(session: Session, user_id: int) -> list[str]:
    """The public key lines to inject into a user's jobs (authorized_keys)."""
    return list(session.scalars(sa.select(SshKey.public_key).where(SshKey.user_id == user_id).order_by(SshKey.id)))
