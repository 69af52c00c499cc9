"""What every rig-conductor process reads from its RIG_* environment, the conductor and the agent
runtime alike: the prefix, an optional .env file, Redis (URL, mode, sentinels, TLS) and the log
format; and how a bad value becomes one line naming its variable.

No database driver here: the agent runtime builds its settings on this alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from redis.connection import parse_url

ENV_PREFIX = "RIG_"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
RedisMode = Literal["standalone", "cluster", "sentinel"]


def comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CommaList = Annotated[tuple[str, ...], NoDecode]


def _unset_if_blank(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


def _lowered(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


# `RIG_X=` (empty, or spaces only) means what leaving RIG_X out means: unset.
BlankIsUnset = BeforeValidator(_unset_if_blank)
# A choice is read whatever its case and surrounding spaces.
AnyCase = BeforeValidator(_lowered)


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
    redis_mode: Annotated[RedisMode, AnyCase] = Field(
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
    log_format: Annotated[Literal["text", "json"], AnyCase] = Field(
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
    redis_sentinel_password: Annotated[SecretStr | None, BlankIsUnset] = Field(
        default=None, description="sentinel mode: the password the sentinels require, if any"
    )
    redis_tls_ca_file: Annotated[Path | None, BlankIsUnset] = Field(
        default=None, description="CA bundle for `rediss://` URLs (and sentinels over TLS)"
    )
    redis_tls_cert_file: Annotated[Path | None, BlankIsUnset] = Field(
        default=None, description="client certificate for TLS (with `RIG_REDIS_TLS_KEY_FILE`)"
    )
    redis_tls_key_file: Annotated[Path | None, BlankIsUnset] = Field(
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

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _parse_sentinels(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        parsed: list[tuple[str, int]] = []
        for part in comma_list(value):
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
    """The database number a redis:// URL names (its path, else `?db=`), as redis-py reads it."""
    try:
        parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"is not a Redis URL redis-py can read: {exc}") from None
    return int(parsed.get("db") or 0)


class SettingsError(Exception):
    """A bad RIG_* value, phrased as one line that names the variable."""


def explain(exc: ValidationError, *, secret: frozenset[str]) -> str:
    """The first validation error as `RIG_<FIELD>: <problem> (got <value>)`; secret values
    (`secret`: field names) are never echoed."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else "?"
    message = str(error["msg"]).removeprefix("Value error, ")
    variable = ENV_PREFIX + field.upper()
    if field in secret or error.get("input") in (None, (), ""):
        return f"{variable}: {message}"
    return f"{variable}: {message} (got {error['input']!r})"
