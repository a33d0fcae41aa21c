"""Who is asking, what they may do, and the CSRF wall in front of every action.

A request is authenticated by one of: `Authorization: Bearer <token>`, the
`hw_console` cookie the login form sets (the same token, HttpOnly and
SameSite=Strict), or — only when `HANGO_CONSOLE_PROXY_HEADER` is set — the user name a
trusted proxy puts in that header. Each credential maps to a grant: a role (`read`,
or `act`: read and decide) and the tenants it sees. Nothing else gets in.

Actions (POST) also need: an Origin / Sec-Fetch-Site that is not another site, and,
unless the request carries its own Authorization header (which browsers never add
to a cross-site request), the form's CSRF token, an HMAC of the credential under a
key of this process.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from hango_worker.config import ConsoleGrant, Settings
from hango_worker.store.repo import DEFAULT_TENANT_ID

COOKIE = "hw_console"


class Refused(Exception):
    """An HTTP refusal: status and a one-line reason (shown to the caller)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Who:
    name: str  # for `decided_by`: "console:<name>"
    role: str
    tenants: tuple[str, ...]
    credential: str  # what the CSRF token is bound to
    by_header: bool  # an Authorization header: not something a browser adds cross-site

    @property
    def can_act(self) -> bool:
        return self.role == "act"


def _tenants(grant: ConsoleGrant) -> tuple[str, ...]:
    return tuple(str(t) for t in grant.tenants) or (DEFAULT_TENANT_ID,)


def _fingerprint(token: str) -> str:
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:8]


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self.tokens = dict(settings.console_tokens)
        self.header = settings.console_proxy_header
        self.users = dict(settings.console_proxy_users)
        self.key = secrets.token_bytes(32)  # CSRF tokens of this process

    def _token(self, token: str, by_header: bool) -> Who:
        match = None
        for known, grant in self.tokens.items():  # compare every one, in constant time
            if hmac.compare_digest(known.encode(), token.encode()):
                match = (known, grant)
        if match is None:
            raise Refused(401, "unknown token")
        known, grant = match
        return Who(grant.name or _fingerprint(known), grant.role, _tenants(grant), known, by_header)

    def identify(self, request: Request) -> Who:
        """The caller, or Refused(401)."""
        auth = request.headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Refused(401, "Authorization must be 'Bearer <token>'")
            return self._token(token.strip(), by_header=True)
        if self.header and (user := request.headers.get(self.header)):
            grant = self.users.get(user)
            if grant is None:
                raise Refused(401, f"user {user!r} has no console grant")
            return Who(user, grant.role, _tenants(grant), "user:" + user, by_header=False)
        cookie = request.cookies.get(COOKIE)
        if cookie:
            return self._token(cookie, by_header=False)
        raise Refused(401, "sign in: a bearer token or the login form")

    def valid_token(self, token: str) -> bool:
        try:
            self._token(token, by_header=False)
        except Refused:
            return False
        return True

    def csrf(self, who: Who) -> str:
        return hmac.new(self.key, who.credential.encode(), hashlib.sha256).hexdigest()

    def check_action(self, request: Request, who: Who, form_token: str | None) -> None:
        """Refused(403) for a read-only caller, a cross-site request or a bad CSRF token."""
        same_origin(request)
        if not who.can_act:
            raise Refused(403, "this credential is read-only; deciding needs the act role")
        if who.by_header:
            return
        if not form_token or not hmac.compare_digest(form_token, self.csrf(who)):
            raise Refused(403, "missing or wrong CSRF token: reload the page and try again")


def same_origin(request: Request) -> None:
    """Refused(403) when the browser says the request comes from another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Refused(403, "cross-site request refused")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise Refused(403, "cross-site request refused (Origin is another site)")


def tenant_of(who: Who, asked: str | None) -> str:
    """The tenant a list page shows: the one asked for (if granted), else the first."""
    if asked is None or asked == "":
        return who.tenants[0]
    try:
        asked = str(uuid.UUID(asked))
    except ValueError:
        raise Refused(400, f"{asked!r} is not a tenant id") from None
    if asked not in who.tenants:
        raise Refused(404, "no such tenant for this credential")
    return asked
