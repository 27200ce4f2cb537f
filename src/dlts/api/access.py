"""/api/v1/me/ssh-keys, /me/allowed-ips, /me/tokens, /me/registry-credentials: the caller's SSH keys,
allowed IPs, API tokens and image registry logins."""

from __future__ import annotations

from flask import current_app
from flask.views import MethodView

from dlts.api.auth import authenticate, principal
from dlts.api.blueprint import Blueprint
from dlts.api.schemas import (
    AllowedIpArgs,
    AllowedIpCreateSchema,
    AllowedIpListSchema,
    AllowedIpSchema,
    RegistryCredentialCreateSchema,
    RegistryCredentialListSchema,
    RegistryCredentialSchema,
    SshKeyCreateSchema,
    SshKeyListSchema,
    SshKeySchema,
    TokenCreateSchema,
    TokenListSchema,
    TokenSchema,
)
from dlts.extensions import db, settings_of
from dlts.services import allowed_ips, registry_credentials, ssh_keys, tokens

blp = Blueprint("access", __name__, description="Your SSH keys, allowed IPs, API tokens and registry credentials")
blp.before_request(authenticate)
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


@blp.route("/me/ssh-keys")
class SshKeys(MethodView):
    @blp.response(200, SshKeyListSchema)
    @blp.doc(security=SECURITY)
    def get(self):
        """Your SSH public keys (injected into every job you run)."""
        return {"items": ssh_keys.list_keys(db.session(), principal()), "next_cursor": None}

    @blp.arguments(SshKeyCreateSchema)
    @blp.response(201, SshKeySchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Add an OpenSSH public key (ed25519, ECDSA, RSA >= 2048 bits); duplicates are refused."""
        return ssh_keys.add_key(db.session(), principal(), body["public_key"], body.get("name"))


@blp.route("/me/ssh-keys/<int(max=4611686018427387904):key_id>", methods=["DELETE"])
@blp.response(204)
@blp.doc(security=SECURITY)
def delete_ssh_key(key_id: int):
    """Remove one of your SSH keys."""
    ssh_keys.delete_key(db.session(), principal(), key_id)


@blp.route("/me/allowed-ips")
class AllowedIps(MethodView):
    @blp.arguments(AllowedIpArgs, location="query")
    @blp.response(200, AllowedIpListSchema)
    @blp.doc(security=SECURITY)
    def get(self, args):
        """Your allowed IPs that have not expired (cluster admins: ?user=NAME for anyone's)."""
        return {"items": allowed_ips.list_entries(db.session(), principal(), args.get("user")), "next_cursor": None}

    @blp.arguments(AllowedIpCreateSchema)
    @blp.response(201, AllowedIpSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Allow an IPv4/IPv6 address or CIDR for allow_ip_days; adding one again renews it."""
        return allowed_ips.add_entry(db.session(), settings_of(current_app), principal(), body["ip"], body.get("user"))


@blp.route("/me/allowed-ips/<int(max=4611686018427387904):entry_id>", methods=["DELETE"])
@blp.response(204)
@blp.doc(security=SECURITY)
def delete_allowed_ip(entry_id: int):
    """Remove an allowed IP (yours; cluster admins: anyone's)."""
    allowed_ips.delete_entry(db.session(), principal(), entry_id)


@blp.route("/me/tokens")
class Tokens(MethodView):
    @blp.response(200, TokenListSchema)
    @blp.doc(security=SECURITY)
    def get(self):
        """Your working API tokens (prefix, created, last used, expiry); never the tokens themselves."""
        return {"items": tokens.list_tokens(db.session(), principal()), "next_cursor": None}

    @blp.arguments(TokenCreateSchema)
    @blp.response(201, TokenSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Create a token; the answer carries it once (only its hash is stored)."""
        return tokens.create_token(db.session(), principal(), body["name"], body["expires_days"])


@blp.route("/me/tokens/<int(max=4611686018427387904):token_id>", methods=["DELETE"])
@blp.response(204)
@blp.doc(security=SECURITY)
def revoke_token(token_id: int):
    """Revoke one of your tokens; it stops working at once."""
    tokens.revoke_token(db.session(), principal(), token_id)


@blp.route("/me/registry-credentials")
class RegistryCredentials(MethodView):
    @blp.response(200, RegistryCredentialListSchema)
    @blp.doc(security=SECURITY)
    def get(self):
        """Your private registry logins (server, username, created); never the passwords."""
        return {"items": registry_credentials.list_mine(db.session(), principal()), "next_cursor": None}

    @blp.arguments(RegistryCredentialCreateSchema)
    @blp.response(201, RegistryCredentialSchema)
    @blp.doc(security=SECURITY)
    def post(self, body):
        """Add a registry login your jobs pull their images with (before the VC's); the password is stored
        encrypted and never returned."""
        return registry_credentials.add_mine(db.session(), settings_of(current_app).secret_key, principal(),
                                             body["server"], body["username"], body["password"])


@blp.route("/me/registry-credentials/<int(max=4611686018427387904):credential_id>", methods=["DELETE"])
@blp.response(204)
@blp.doc(security=SECURITY)
def delete_registry_credential(credential_id: int):
    """Remove one of your registry credentials."""
    registry_credentials.delete_mine(db.session(), principal(), credential_id)
