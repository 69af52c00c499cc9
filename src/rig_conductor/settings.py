"""The one settings object, read from RIG_* environment variables (and an optional .env).

Built once in `cli.py` and passed down; nothing else reads the environment for these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from rig_conductor.domain import Limits

ENV_PREFIX = "RIG_"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Values of these settings are never echoed back in an error: they may carry credentials.
_SECRET_FIELDS = frozenset(
    {
        "redis_url",
        "database_url",
        "api_tokens",
        "operator_tokens",
        "viewer_tokens",
        "redis_sentinel_password",
        "session_secret",
    }
)
_TOKEN_FIELDS = ("api_tokens", "operator_tokens", "viewer_tokens")
SESSION_SECRET_MIN = 32
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
RedisMode = Literal["standalone", "cluster", "sentinel"]


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CommaList = Annotated[tuple[str, ...], NoDecode]


class RigSettings(BaseSettings):
    """What the conductor's and the agent runtime's settings share: the RIG_ prefix, an optional
    .env file, the Redis URL and the log format."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        extra="ignore",
        frozen=True,
    )

    # The Redis topology ("Redis topologies" in the contract). Fields are validated in the
    # order they are declared, so the later ones can check themselves against the earlier.
    redis_mode: RedisMode = Field(
        default="standalone",
        description="`standalone`, `cluster` (Redis Cluster; the URL names any node) or `sentinel`",
    )
    redis_url: str = Field(
        default="redis://localhost:6379/0",
        description=(
            "Redis holding the streams: `redis://`, `rediss://` (TLS) or `unix://`, "
            "with any ACL user and password"
        ),
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`text` or `json` (one object per line; `message` is the same sentence)",
    )
    redis_sentinels: Annotated[tuple[tuple[str, int], ...], NoDecode] = Field(
        description="sentinel mode: comma list of `host:port` sentinels",
        default=(),
        validate_default=True,
    )
    redis_sentinel_master: str = Field(
        description="sentinel mode: the monitored master's name", default="mymaster", min_length=1
    )
    redis_sentinel_password: SecretStr | None = Field(
        default=None, description="sentinel mode: the password the sentinels require, if any"
    )
    redis_tls_ca_file: Path | None = Field(
        default=None, description="CA bundle for `rediss://` URLs (and sentinels over TLS)"
    )
    redis_tls_cert_file: Path | None = Field(
        default=None, description="client certificate for TLS (with `RIG_REDIS_TLS_KEY_FILE`)"
    )
    redis_tls_key_file: Path | None = Field(
        description="the client certificate's key (with `RIG_REDIS_TLS_CERT_FILE`)",
        default=None,
        validate_default=True,
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str, info: ValidationInfo) -> str:
        if not value.startswith(_REDIS_SCHEMES):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        if info.data.get("redis_mode") == "cluster":
            if value.startswith("unix://"):
                raise ValueError("cluster mode needs a redis:// or rediss:// URL, not a socket")
            if _url_db(value) != 0:
                raise ValueError("cluster mode has database 0 only; remove the /<db> from the URL")
        return value

    @field_validator("log_format", "redis_mode", mode="before")
    @classmethod
    def _lower_choice(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _parse_sentinels(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        parsed: list[tuple[str, int]] = []
        for part in _comma_list(value):
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("each sentinel must be host:port")
            parsed.append((host.strip("[]"), int(port)))
        return tuple(parsed)

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels_for_mode(
        cls, value: tuple[tuple[str, int], ...], info: ValidationInfo
    ) -> tuple[tuple[str, int], ...]:
        if info.data.get("redis_mode") == "sentinel" and not value:
            raise ValueError("sentinel mode needs at least one host:port sentinel")
        return value

    @field_validator("redis_sentinel_password", mode="before")
    @classmethod
    def _blank_password(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value else value

    @field_validator(
        "redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file", mode="before"
    )
    @classmethod
    def _blank_path(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("redis_tls_key_file")
    @classmethod
    def _key_with_cert(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if (value is None) != (info.data.get("redis_tls_cert_file") is None):
            raise ValueError(
                "the client certificate needs both RIG_REDIS_TLS_CERT_FILE and "
                "RIG_REDIS_TLS_KEY_FILE"
            )
        return value


def _url_db(url: str) -> int:
    """The database number a redis:// URL names: its path, else `?db=`, else 0."""
    rest = url.partition("://")[2]
    path, _, query = rest.partition("/")[2].partition("?")
    if path.isdigit():
        return int(path)
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "db" and value.isdigit():
            return int(value)
    return 0


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
    dry_run: bool = Field(
        default=False, description="log and count decisions, change nothing in Redis"
    )
    k8s_enabled: Literal["true", "false", "auto"] = Field(
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
            "comma list of bearer tokens (the agents' role); when set, every "
            "`/api/*` call needs one"
        ),
    )
    operator_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "bearer tokens allowed to change things: non-dry scans, dead-letter requeue and "
            "delete, the console's actions; when set, `RIG_API_TOKENS` alone gets 403 there"
        ),
    )
    viewer_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description=(
            "bearer tokens that may only read: `GET /api/*`, dry-run scans, the console "
            "without actions"
        ),
    )
    http_root_path: str = Field(
        default="",
        description=(
            "path prefix the API and console are served under behind an ingress (e.g. `/rig`), "
            "whether the ingress strips it or not"
        ),
    )
    session_secret: SecretStr | None = Field(
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

    @field_validator("streams", "agent_ids", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator(*_TOKEN_FIELDS, mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("session_secret", mode="before")
    @classmethod
    def _blank_secret(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

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
    def any_tokens(self) -> bool:
        """Whether any role's tokens are set: then every /api call needs one."""
        return bool(self.api_tokens or self.operator_tokens or self.viewer_tokens)

    @field_validator("k8s_enabled", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

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
    if name in _TOKEN_FIELDS:
        return f"<{len(value)} tokens>" if isinstance(value, tuple) else "<hidden>"
    if isinstance(value, SecretStr):
        return "<hidden>"
    try:
        return make_url(str(value)).render_as_string(hide_password=True)
    except ArgumentError:
        return "<hidden>"


class SettingsError(Exception):
    """A bad RIG_* value, phrased as one line that names the variable."""


def load_settings(**overrides: Any) -> Settings:
    """Read the environment; raise SettingsError with one operator-readable line on bad input."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(explain(exc)) from None


def explain(exc: ValidationError, *, secret: frozenset[str] = _SECRET_FIELDS) -> str:
    """The first validation error as `RIG_<FIELD>: <problem> (got <value>)`; secret values
    (`secret`: field names) are never echoed."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else "?"
    message = str(error["msg"]).removeprefix("Value error, ")
    variable = ENV_PREFIX + field.upper()
    if field in secret or error.get("input") in (None, (), ""):
        return f"{variable}: {message}"
    return f"{variable}: {message} (got {error['input']!r})"
