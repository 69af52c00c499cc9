"""Who may do what: the token roles, shared by the JSON API and the console.

- viewer (`RIG_VIEWER_TOKENS`): reads, and dry-run scans, which change nothing;
- agent (`RIG_API_TOKENS`, unbound): reads and reports events for any agent, dispatches; also
  changes things (non-dry scans, dead-letter requeue and delete, console actions) while no
  operator tokens are set;
- bound agent (`RIG_AGENT_TOKENS`, `agentId:token`, or a pod's ServiceAccount token): reports
  events for its own agent only (`policy.speaking`), and nothing else: no reads, no dispatch;
- operator (`RIG_OPERATOR_TOKENS`): everything.

With no tokens at all the API is open and everyone is an operator. A presented token is looked
up by its SHA-256 digest, so a heartbeat costs one hash and one dict lookup however many agents
hold tokens, and the lookup's timing depends on the digest only, which tells a guesser nothing
about how close a guess came.

Audit lines and session cookies name a token by its fingerprint: an HMAC of it under the
server's secret (RIG_SESSION_SECRET), so a fingerprint cannot be matched against guessed
tokens without the secret.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy.speaking import Binding


class Role(enum.IntEnum):
    """Ordered: a role may do what the ones below it may."""

    VIEWER = 1
    AGENT = 2
    OPERATOR = 3


class Need(enum.Enum):
    """What a request asks to do."""

    READ = "read"
    REPORT = "report"  # POST /api/events
    CHANGE = "change"  # non-dry scans, dead-letter requeue and delete, console actions


@dataclass(frozen=True)
class Caller:
    role: Role
    # A short fingerprint of the token (never the token), for audit lines: `operator:1a2b3c4d`.
    who: str
    # A bound credential speaks only for this agent or pod; None: an unbound token.
    binding: Binding | None = None


def bound_agent(agent: AgentId, who: str) -> Caller:
    return Caller(Role.AGENT, who, Binding(agent=agent))


def pod(name: ConsumerName, namespace: str) -> Caller:
    """A pod that proved who it is with its ServiceAccount token (a TokenReview)."""
    return Caller(Role.AGENT, f"pod:{namespace}/{name}", Binding(pod=name))


ANONYMOUS = Caller(Role.OPERATOR, "anonymous")


class Tokens:
    """The configured tokens and the server's secret (`secret`; None: a random one for this
    process), which keys the tokens' fingerprints and the console's sessions."""

    def __init__(
        self,
        *,
        agent: Iterable[bytes] = (),
        operator: Iterable[bytes] = (),
        viewer: Iterable[bytes] = (),
        bound: Iterable[tuple[str, bytes]] = (),
        secret: bytes | None = None,
        agent_auth: bool = False,
    ) -> None:
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self._all: list[tuple[bytes, Role]] = [
            *((t, Role.OPERATOR) for t in operator),
            *((t, Role.AGENT) for t in agent),
            *((t, Role.VIEWER) for t in viewer),
        ]
        self._names = [(self.name(token, role), token) for token, role in self._all]
        self.has_operators = any(role is Role.OPERATOR for _, role in self._all)
        self.bound_agents = frozenset(AgentId(agent_id) for agent_id, _ in bound)
        # Pods may present ServiceAccount tokens (checked by a TokenReview, not here).
        self.agent_auth = agent_auth
        # digest -> the caller the token makes: the strongest role wins; a token configured both
        # unbound and bound stays unbound (the operator said it may speak for anyone).
        self._by_digest: dict[bytes, Caller] = {}
        for agent_id, token in bound:
            name = f"agent:{agent_id}:{self.fingerprint(token)}"
            self._by_digest[_digest(token)] = bound_agent(AgentId(agent_id), name)
        for token, role in sorted(self._all, key=lambda item: item[1]):
            self._by_digest[_digest(token)] = Caller(role, self.name(token, role))

    def derive(self, purpose: bytes, value: bytes = b"") -> bytes:
        """A key or tag for `purpose` (and `value`), HMAC-SHA256 under the server's secret."""
        return hmac.new(self.secret, purpose + b"\0" + value, hashlib.sha256).digest()

    def fingerprint(self, token: bytes) -> str:
        """A short name for a token in audit lines and cookies: never the token itself."""
        return self.derive(b"rig-token-fingerprint", token).hex()[:8]

    def name(self, token: bytes, role: Role) -> str:
        return f"{role.name.lower()}:{self.fingerprint(token)}"

    @property
    def open(self) -> bool:
        """No credential configured: no sign-in, everyone may do everything."""
        return not self._by_digest and not self.agent_auth

    def caller(self, presented: bytes) -> Caller | None:
        """The caller a configured token makes (its strongest role); None for an unknown token
        (which may still be a pod's ServiceAccount token: the TokenReview decides)."""
        return self._by_digest.get(_digest(presented))

    def token_for(self, who: str) -> bytes | None:
        """The configured token behind an audit name (to check a session's signature)."""
        found: bytes | None = None
        for name, token in self._names:
            if hmac.compare_digest(name.encode(), who.encode()):
                found = token
        return found

    def allows(self, caller: Caller, need: Need) -> bool:
        if caller.binding is not None:
            # Reports only, and only for itself (the events route applies `policy.speaking`).
            return need is Need.REPORT
        if need is Need.READ:
            return True
        if need is Need.REPORT:
            return caller.role >= Role.AGENT
        if caller.role is Role.OPERATOR:
            return True
        return caller.role is Role.AGENT and not self.has_operators


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


# A scan asks to change things unless it is a dry run, which only the route knows for sure: it
# reads `dryRun` as FastAPI parsed it (`POST ...?dryRun=true&dryRun=false` is a real scan).
# The guard lets any valid token through to it; the route asks for CHANGE itself.
SCAN_PATH = "/api/reaper/scan"


def api_need(method: str, path: str) -> Need:
    """What a request under /api asks to do, from its method and path alone (for a scan: the
    least it may ask; the route checks the rest)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return Need.READ
    if path == "/api/events":
        return Need.REPORT
    if path == SCAN_PATH:
        return Need.READ
    return Need.CHANGE
