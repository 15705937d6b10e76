"""What stands between the engine port and the world: the shared secret and the catalogue.

The gateway authenticates every call to the engine with a secret in the
metadata key `headstart-engine-secret`; a replica answers a call without it
(or with another one) UNAUTHENTICATED and does nothing else. The secret comes
from, in order: the deployment's configuration (`headstart serve` generates
one per start), the environment variable `HEADSTART_ENGINE_SECRET`, or the
file named by `HEADSTART_ENGINE_SECRET_FILE` (a mounted Kubernetes Secret).
With none of them the engine refuses every call (fail closed).

Databases reach a replica only by catalogue name (`headstart.schema.catalogue`):
an attach or Complete naming anything else is NOT_FOUND "unknown database".
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from headstart.schema.catalogue import Catalogue

log = logging.getLogger(__name__)

SECRET_METADATA_KEY = "headstart-engine-secret"
# The tenant a call works for, as the gateway authenticated it: the engine's
# scheduler orders work of one class fairly across tenants. Trusted only
# because the call carries the engine secret (only the gateway has it).
TENANT_METADATA_KEY = "headstart-tenant"
SECRET_ENV = "HEADSTART_ENGINE_SECRET"
SECRET_FILE_ENV = "HEADSTART_ENGINE_SECRET_FILE"


def tenant_of(metadata) -> str | None:
    """The tenant named in a call's metadata (pairs), or None."""
    return next((v for k, v in (metadata or ()) if k == TENANT_METADATA_KEY), None) or None


class EngineUnauthenticated(Exception):
    """A call without the engine secret. `code` is what the caller sees."""

    code = "UNAUTHENTICATED"

    def __init__(self):
        super().__init__("missing or wrong engine secret")
        self.message = str(self)


def generate_secret() -> str:
    """A fresh secret (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def configured_secret(explicit: str | None = None) -> str | None:
    """The engine secret: `explicit`, else $HEADSTART_ENGINE_SECRET, else the file in $HEADSTART_ENGINE_SECRET_FILE."""
    if explicit:
        return explicit
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV]
    path = os.environ.get(SECRET_FILE_ENV)
    if path:
        return Path(path).read_text().strip() or None
    return None


class EngineGuard:
    """Checks a call's secret; maps catalogue names to the specs the runtime loads."""

    def __init__(self, secret: str | None, catalogue: Catalogue):
        self._secret = (secret or "").encode()
        self.catalogue = catalogue
        if not self._secret:
            log.error("no engine secret configured (%s): every call will be refused", SECRET_ENV)

    def check(self, metadata) -> None:
        """Raises EngineUnauthenticated unless `metadata` (pairs) carries the secret."""
        given = next((v for k, v in (metadata or ()) if k == SECRET_METADATA_KEY), "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        if not self._secret or not hmac.compare_digest(self._secret, given):
            raise EngineUnauthenticated()

    def spec(self, db: str) -> str:
        """The spec of a catalogue name (raises UnknownDatabase, code NOT_FOUND)."""
        return self.catalogue.spec(db)
