"""Tenants: whom a bearer token belongs to, and what each one may see.

A server has no token (one open space), one token (`HYDRAPLAN_API_TOKEN`: the tenant `default`,
an admin, as before tenants existed), or a token file (`HYDRAPLAN_API_TOKENS_FILE`) of several
tenants, with or without the single token beside it. The file holds digests, never tokens: one
line per token,

    <tenant> sha256:<hex digest of the token's UTF-8 bytes> [admin]

with `#` comments and blank lines ignored (`printf %s "$TOKEN" | sha256sum` gives the digest).
A tenant sees, cancels and deletes only its own jobs, sessions and uploaded profiles; an admin
sees all of them. A request's tenant is resolved once per request by the router dependency
(`auth.current_tenant`) and kept in `current_tenant_var` for the code it calls, so uploaded
profiles resolve in the caller's space from threads and jobs too (they copy the context).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hydraplan.api.service.store import Store

TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Tenant:
    """One tenant: its name, and whether it is an admin (sees every tenant's state)."""

    name: str
    admin: bool = False

    def may_see(self, owner: str | None) -> bool:
        """Whether state owned by `owner` (None: made before tenants) is visible to this tenant."""
        return self.admin or owner == self.name


# A server without any token: everyone shares one space, as before tenants existed.
ANONYMOUS = Tenant("anonymous", admin=True)
current_tenant_var: ContextVar[Tenant] = ContextVar("hydraplan_tenant", default=ANONYMOUS)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_token_file(path: str) -> dict[str, Tenant]:
    """Digest -> tenant of every line of the token file; ValueError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path!r}: {exc}") from None
    tenants: dict[str, Tenant] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}, line {number}"
        if len(fields) not in (2, 3) or (len(fields) == 3 and fields[2] != "admin"):
            raise ValueError(f"{where}: expected '<tenant> sha256:<64 hex digits> [admin]'")
        name, digest = fields[0], DIGEST.fullmatch(fields[1])
        if not TENANT_NAME.fullmatch(name):
            raise ValueError(
                f"{where}: tenant {name[:70]!r} is not 1-64 of a-z, 0-9, '_', '-' (a letter or digit first)"
            )
        if digest is None:
            raise ValueError(f"{where}: the token must be given as sha256:<64 lowercase hex digits>, never in clear")
        if digest.group(1) in tenants:
            raise ValueError(f"{where}: the same token digest is listed twice")
        tenants[digest.group(1)] = Tenant(name, admin=len(fields) == 3)
    if not tenants:
        raise ValueError(f"the token file {path!r} lists no token")
    return tenants


class TokenBook:
    """The server's tokens, as digests: which tenant a presented token belongs to."""

    def __init__(self, tenants: dict[str, Tenant]) -> None:
        self._tenants = tenants

    @classmethod
    def build(cls, api_token: str | None, tokens_file: str | None) -> TokenBook | None:
        """The book of the settings' tokens; None when the server has none (open)."""
        if api_token is None and tokens_file is None:
            return None
        tenants = read_token_file(tokens_file) if tokens_file else {}
        if api_token is not None:
            tenants.setdefault(token_digest(api_token), Tenant(DEFAULT_TENANT, admin=True))
        return cls(tenants)

    def tenant_of(self, token: str) -> Tenant | None:
        """The tenant of `token`, or None; the digests are compared in constant time, all of them."""
        presented = token_digest(token)
        found = None
        for digest, tenant in self._tenants.items():
            if hmac.compare_digest(presented, digest):
                found = tenant
        return found


def tenant_registry(registry: str, tenant: str) -> str:
    """The registry that counts one tenant's members of `registry` (its quota)."""
    return f"{registry}@{tenant}"


def admit(
    store: Store, tenant: Tenant, registry: str, member: str, ttl_s: float, max_members: int, quota: int | None
) -> Literal["tenant", "server"] | None:
    """Register `member` in the shared `registry` (at most `max_members`) and, for a tenant under
    a quota (`quota` set; admins have none), in the tenant's own (at most `quota`); None when
    admitted, else which cap refused it (nothing is registered then). A known member is renewed."""
    capped = quota is not None and not tenant.admin
    own = tenant_registry(registry, tenant.name)
    if capped and not store.admit(own, member, ttl_s, quota):
        return "tenant"
    if not store.admit(registry, member, ttl_s, max_members):
        if capped:
            store.forget(own, member)
        return "server"
    return None


def forget(store: Store, owner: str | None, registry: str, member: str) -> None:
    """Remove `member` from the shared registry and from its owner's."""
    store.forget(registry, member)
    if owner is not None:
        store.forget(tenant_registry(registry, owner), member)
