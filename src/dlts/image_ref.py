"""Container image references: what a job's ``image`` may be.

The grammar is the one registries and container runtimes parse (the ``distribution/reference``
package that containerd and Docker use): ``[host[:port]/]path[:tag][@algorithm:hex]``, path
components lowercase, a tag of at most 128 characters, a name of at most 255. A digest pins the
exact image: ``sha256:`` with 64 lowercase hex digits (or ``sha512:`` with 128), the forms the OCI
image spec registers. ``name:tag@sha256:...`` is valid too; the runtime then pulls by the digest
and the tag is only a note for people. DLTS passes the reference to the cluster unchanged.

The API refuses anything else at submission (``problem`` names what is wrong), so a typo is an
answer to the user, not a pod that never pulls.
"""

from __future__ import annotations

import re

MAX_NAME_CHARS = 255
# a name, ':' and a tag of 128, '@sha512:' and 128 hex digits
MAX_REFERENCE_CHARS = MAX_NAME_CHARS + 1 + 128 + 8 + 128
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
# The algorithms the OCI image spec registers, with their encoded length; lowercase hex only.
DIGESTS = {"sha256": re.compile(r"[a-f0-9]{64}", re.ASCII), "sha512": re.compile(r"[a-f0-9]{128}", re.ASCII)}
# the same grammar with the digests checked above, for the OpenAPI document (ECMA 262: \\w spelled out)
PATTERN = ("^" + rf"{_NAME}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@(?:sha256:[a-f0-9]{{64}}|sha512:[a-f0-9]{{128}}))?"
           + "$")
EXAMPLES = "like registry.example.com/team/train:1.2, pytorch/pytorch:2.3 or name@sha256:<64 hex digits>"


def problem(image: str) -> str | None:
    """What makes ``image`` no image reference (a sentence for the user), or None when it is one."""
    if not isinstance(image, str) or not image:
        return f"give an image reference ({EXAMPLES})"
    if len(image) > MAX_REFERENCE_CHARS:
        return f"an image reference has at most {MAX_REFERENCE_CHARS} characters ({EXAMPLES})"
    if any(c.isspace() for c in image) or not image.isascii() or not image.isprintable():
        return f"an image reference has no spaces, control or non-ASCII characters ({EXAMPLES})"
    name, at, digest = image.partition("@")
    if at:
        algorithm, colon, encoded = digest.partition(":")
        pattern = DIGESTS.get(algorithm)
        if not colon or pattern is None or not pattern.fullmatch(encoded):
            return ("the part after '@' must be a digest: sha256: and 64 lowercase hex digits (or sha512: and "
                    f"128), as the registry shows it; got {digest[:80]!r}")
    match = REFERENCE.fullmatch(image)
    if match is None:
        if name.lower() != name and REFERENCE.fullmatch(image.lower()):
            return f"repository names are lowercase ({EXAMPLES})"
        return f"{image[:80]!r} is not an image reference ({EXAMPLES})"
    if len(match.group("name")) > MAX_NAME_CHARS:
        return f"the image name is longer than {MAX_NAME_CHARS} characters"
    return None
