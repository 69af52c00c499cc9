"""The one settings object, read from RIG_* environment variables (and an optional .env).

Built once in `cli.py` and passed down; nothing else reads the environment for these.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import NoDecode
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from rig_conductor.domain import Limits
from rig_conductor.settings_base import (
    ENV_PREFIX,
    AnyCase,
    BlankIsUnset,
    CommaList,
    RigSettings,
    SettingsError,
    comma_list,
    explain,
)

__all__ = ["ENV_PREFIX", "RigSettings", "Settings", "SettingsError", "explain", "load_settings"]

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Values of these settings are never echoed back in an error: they may carry credentials.
_SECRET_FIELDS = frozenset(
    {
        "redis_url",
        "database_url",
        "api_tokens",
        "operator_tokens",
        "viewer_tokens",
        "agent_tokens",
        "redis_sentinel_password",
        "session_secret",
    }
)
_TOKEN_FIELDS = ("api_tokens", "operator_tokens", "viewer_tokens")
SESSION_SECRET_MIN = 32
TOKEN_MIN = 16


class Settings(RigSettings):
    """Every RIG_* variable of the contract, validated at start-up."""

    database_url: str = Field(
        default="postgresql+psycopg://postgres:postgres@localhost:5432/rig",
        description="PostgreSQL for heartbeats, the event log and assignment state",
    )
    http_host: str = Field(default="0.0.0.0", description="API bind address")
    http_port: int = Field(description="API port", default=8080, ge=1, le=65535)
    dispatch_stream: str = Field(
        description="where ISSUE_ASSIGNED entries are appended",
        default="rig:dispatch",
        min_length=1,
    )
    # Dispatch answers only once this many replicas hold the entry (WAIT n), so an acknowledged
    # dispatch survives a failover.
    redis_wait_replicas: int = Field(
        description="dispatch answers 201 only once this many replicas hold the entry (`WAIT n`)",
        default=0,
        ge=0,
    )
    streams: CommaList = Field(
        default=("rig:dispatch", "assignments:*"),
        description=(
            "streams the reaper scans: names or glob patterns (resolved with `SCAN "
            "... TYPE stream`)"
        ),
    )
    agent_ids: CommaList = Field(
        default=(), description="comma list of known agent ids; ids seen in heartbeats are added"
    )
    entry_stale_ms: int = Field(
        description="a pending entry idle at least this long may be reclaimed",
        default=300_000,
        ge=0,
    )
    agent_down_ms: int = Field(
        description="no heartbeat for this long = down", default=600_000, gt=0
    )
    scan_interval_s: float = Field(description="reaper period (float allowed)", default=60.0, gt=0)
    startup_delay_s: float = Field(
        description="delay before the first scan (float allowed, 0 allowed)", default=60.0, ge=0
    )
    max_deliveries: int = Field(
        description=(
            "an entry whose delivery count has reached this is dead-lettered, not reclaimed"
        ),
        default=5,
        ge=1,
    )
    entry_deadline_ms: int = Field(
        description=(
            "an entry held by a live owner with no progress for this long is "
            "stalled and moved alone; `0` turns it off"
        ),
        default=3_600_000,
        ge=0,
    )
    reclaim_degraded: bool = Field(
        default=True, description="also reclaim the entries of owners that are alive but degraded"
    )
    degraded_grace_ms: int = Field(
        description=(
            "how long an owner must have reported `degraded` without a break before "
            "its entries move"
        ),
        default=300_000,
        ge=0,
    )
    # Checked against RIG_AGENT_DOWN_MS: forgetting an agent sooner would make it "never heard
    # from", so down (rule 3, docs/rules.md), before its silence had lasted RIG_AGENT_DOWN_MS.
    agent_forget_ms: int = Field(
        description=(
            "an agent or consumer not heard from for this long leaves the registry: its "
            "heartbeat rows and metric series are dropped (agents named in `RIG_AGENT_IDS` or "
            "`RIG_AGENT_TOKENS` stay listed); at least `RIG_AGENT_DOWN_MS`"
        ),
        default=604_800_000,
        gt=0,
    )
    max_consumers_per_agent: int = Field(
        description=(
            "the most consumers one agent may register: a heartbeat naming one more gets 409 "
            "and registers nothing (known consumers keep being heard)"
        ),
        default=1000,
        ge=1,
    )
    dry_run: bool = Field(
        default=False, description="log and count decisions, change nothing in Redis"
    )
    k8s_enabled: Annotated[Literal["true", "false", "auto"], AnyCase] = Field(
        default="auto",
        description=(
            "`true`, `false` or `auto` (on when running in a cluster); in-cluster "
            "config, else `KUBECONFIG`"
        ),
    )
    k8s_namespace: str | None = Field(
        default=None,
        description="where agent pods live (default: the pod's own namespace, else `default`)",
    )
    k8s_label_selector: str = Field(default="", description="selects agent pods")
    api_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "comma list of bearer tokens (the agents' role), each at least 16 characters; when "
            "set, every `/api/*` call needs one"
        ),
    )
    operator_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "bearer tokens (at least 16 characters) allowed to change things: non-dry scans, "
            "dead-letter requeue and delete, the console's actions; when set, `RIG_API_TOKENS` "
            "alone gets 403 there"
        ),
    )
    viewer_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "bearer tokens (at least 16 characters) that may only read: `GET /api/*`, dry-run "
            "scans, the console without actions"
        ),
    )
    agent_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "comma list of `<agentId>:<token>` (the token follows the last colon, at least 16 "
            "characters): a token bound to one agent, which may send HEARTBEAT and WORK_* "
            "only for that agent and its consumers; anything else answers 403"
        ),
    )
    allow_anonymous: bool = Field(
        default=False,
        description=(
            "with no credential of any kind set, `serve` refuses to start unless this is "
            "`true`: then the API and the console are open to anyone who reaches them"
        ),
    )
    forwarded_allow_ips: CommaList = Field(
        default=(),
        description=(
            "comma list of proxy addresses or networks (or `*`) whose `X-Forwarded-For` and "
            "`X-Forwarded-Proto` are believed (the client the failed-token throttles count, "
            "the console cookie's Secure flag); from anyone else those headers are ignored. "
            "Empty: no proxy is trusted, the client is the connection's peer"
        ),
    )
    http_root_path: str = Field(
        default="",
        description=(
            "path prefix the API and console are served under behind an ingress (e.g. `/rig`), "
            "whether the ingress strips it or not"
        ),
    )
    session_secret: Annotated[SecretStr | None, BlankIsUnset] = Field(
        default=None,
        description=(
            "key the console's session cookies and the tokens' audit fingerprints are derived "
            "from (HMAC), at least 32 characters, the same on every replica; empty: a random key "
            "per process, so sessions end when it restarts and do not work across replicas"
        ),
    )
    tenant: str = Field(
        description="tenant the control plane binds its scan to", default="default", min_length=1
    )
    event_retention_days: int = Field(
        description="the event log (and the dispatch markers in Redis) keep this many days",
        default=30,
        ge=1,
    )
    k8s_agent_auth: bool = Field(
        default=False,
        description=(
            "agents may authenticate with their pod's projected ServiceAccount token, checked "
            "with a Kubernetes TokenReview (audience `RIG_K8S_TOKEN_AUDIENCE`); the pod speaks "
            "only for itself. The conductor's ServiceAccount needs `create` on `tokenreviews`"
        ),
    )
    k8s_token_audience: str = Field(
        default="rig-conductor",
        min_length=1,
        description="the audience agents' projected ServiceAccount tokens must carry",
    )

    @field_validator(
        "streams", "agent_ids", *_TOKEN_FIELDS, "agent_tokens", "forwarded_allow_ips", mode="before"
    )
    @classmethod
    def _split(cls, value: Any) -> Any:
        return comma_list(value)

    @field_validator("agent_tokens")
    @classmethod
    def _bound_tokens(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for item in value:
            agent, colon, token = item.get_secret_value().rpartition(":")
            if not colon or not agent.strip():
                raise ValueError("every item must be `<agentId>:<token>`")
            _long_enough(token)
        return value

    @property
    def known_agents(self) -> tuple[str, ...]:
        """The agents the settings name: RIG_AGENT_IDS, then those RIG_AGENT_TOKENS binds tokens
        to. The one list the API (who may speak for whom), the views and the reaper (consumer ->
        agent, rule 2; who stays listed) start from, so they never disagree about an agent."""
        bound = (agent for agent, _ in self.bound_tokens)
        return tuple(dict.fromkeys((*self.agent_ids, *bound)))

    @property
    def bound_tokens(self) -> list[tuple[str, bytes]]:
        """RIG_AGENT_TOKENS as (agent id, token) pairs."""
        pairs = (item.get_secret_value().rpartition(":") for item in self.agent_tokens)
        return [(agent.strip(), token.encode()) for agent, _, token in pairs]

    @field_validator(*_TOKEN_FIELDS)
    @classmethod
    def _long_tokens(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for token in value:
            _long_enough(token.get_secret_value())
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Each entry as the proxy middleware reads it: an address, a network in its canonical
        form (`10.1.2.3/8` is `10.0.0.0/8`: a non-canonical one would be taken for a name and
        trust nobody), or `*`."""
        checked: list[str] = []
        for entry in value:
            if entry == "*":
                checked.append(entry)
                continue
            try:
                if "/" in entry:
                    checked.append(str(ipaddress.ip_network(entry, strict=False)))
                else:
                    checked.append(str(ipaddress.ip_address(entry)))
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address, a network (10.0.0.0/8) or *"
                ) from None
        return tuple(checked)

    @field_validator("session_secret")
    @classmethod
    def _long_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < SESSION_SECRET_MIN:
            raise ValueError(
                f"must be at least {SESSION_SECRET_MIN} characters (e.g. `openssl rand -hex 32`)"
            )
        return value

    @field_validator("http_root_path")
    @classmethod
    def _root_path(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            raise ValueError("must start with / (e.g. /rig)")
        if any(c in value for c in "?# \\"):
            raise ValueError("must be a plain path (no spaces, ? or #)")
        return value

    @property
    def any_credential(self) -> bool:
        """Whether any way to authenticate is configured (a token of any role): then every /api
        call needs one, and `serve` may start without RIG_ALLOW_ANONYMOUS. Every kind of
        credential the conductor accepts belongs in here."""
        return bool(
            self.api_tokens
            or self.operator_tokens
            or self.viewer_tokens
            or self.agent_tokens
            or self.k8s_agent_auth
        )

    def anonymous_problem(self) -> str | None:
        """Why `serve` must refuse to start with these settings (one line naming
        RIG_API_TOKENS), or None: some credential is configured, or RIG_ALLOW_ANONYMOUS is."""
        if self.any_credential or self.allow_anonymous:
            return None
        return (
            "RIG_API_TOKENS: no token of any role is set (RIG_API_TOKENS, RIG_OPERATOR_TOKENS, "
            "RIG_VIEWER_TOKENS, RIG_AGENT_TOKENS) and RIG_K8S_AGENT_AUTH is off, so the API "
            "would be open to anyone; set tokens, or RIG_ALLOW_ANONYMOUS=true to run it open on "
            "purpose"
        )

    @field_validator("agent_forget_ms")
    @classmethod
    def _forget_after_down(cls, value: int, info: ValidationInfo) -> int:
        down = info.data.get("agent_down_ms")
        if isinstance(down, int) and value < down:
            raise ValueError(f"must be at least RIG_AGENT_DOWN_MS ({down})")
        return value

    @field_validator("streams")
    @classmethod
    def _some_streams(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one stream name or pattern")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError("is not a database URL") from None
        if url.get_backend_name() != "postgresql":
            raise ValueError("must be a postgresql:// URL")
        if url.get_driver_name() not in ("psycopg", "psycopg2", "default"):
            raise ValueError("must use the psycopg driver (postgresql+psycopg://...)")
        return value

    @property
    def limits(self) -> Limits:
        return Limits(
            entry_stale_ms=self.entry_stale_ms,
            agent_down_ms=self.agent_down_ms,
            max_deliveries=self.max_deliveries,
            reclaim_degraded=self.reclaim_degraded,
            degraded_grace_ms=self.degraded_grace_ms,
            entry_deadline_ms=self.entry_deadline_ms,
            # A tenth of RIG_AGENT_DOWN_MS, within 0.3..5 s: the listening marks' slack must
            # stay well inside the silence that makes an agent down.
            listen_slack_ms=max(300, min(5_000, self.agent_down_ms // 10)),
        )

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL with psycopg 3 as the driver, whatever form the operator wrote."""
        url = make_url(self.database_url)
        return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)

    def namespace(self) -> str:
        """RIG_K8S_NAMESPACE, else the pod's own namespace, else `default`."""
        if self.k8s_namespace:
            return self.k8s_namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"

    def describe(self) -> dict[str, object]:
        """The effective configuration for the start-up log line, secrets masked."""
        shown: dict[str, object] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name in _SECRET_FIELDS and value is not None:
                value = _mask(name, value)
            shown[ENV_PREFIX + name.upper()] = value
        return shown


def _mask(name: str, value: object) -> object:
    if name in (*_TOKEN_FIELDS, "agent_tokens"):
        return f"<{len(value)} tokens>" if isinstance(value, tuple) else "<hidden>"
    if isinstance(value, SecretStr):
        return "<hidden>"
    try:
        return make_url(str(value)).render_as_string(hide_password=True)
    except ArgumentError:
        return "<hidden>"


def _long_enough(token: str) -> None:
    if len(token) < TOKEN_MIN:
        raise ValueError(
            f"every token must be at least {TOKEN_MIN} characters (e.g. `openssl rand -hex 24`)"
        )


def load_settings(**overrides: Any) -> Settings:
    """Read the environment; raise SettingsError with one operator-readable line on bad input."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(explain(exc, secret=_SECRET_FIELDS)) from None


def settings_for(command: str) -> Settings | None:
    """A command's settings; None once the bad one is named on stderr (the command exits 2)."""
    try:
        return load_settings()
    except SettingsError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
