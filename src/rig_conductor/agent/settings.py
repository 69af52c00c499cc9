"""The agent's settings, read from RIG_* environment variables (and an optional .env).

Built once by the agent's CLI and passed down. Only what a worker pod needs: no database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator

from rig_conductor.agent import token_file
from rig_conductor.settings_base import (
    ENV_PREFIX,
    BlankIsUnset,
    RigSettings,
    SettingsError,
    explain,
)

# Never echoed back in an error or the start-up line: they may carry credentials.
_SECRET_FIELDS = frozenset({"redis_url", "api_token", "redis_sentinel_password"})


class AgentSettings(RigSettings):
    """RIG_* variables of the contract's "Agent runtime" section, validated at start-up."""

    conductor_url: str = Field(
        default="http://localhost:8080", description="the conductor's base URL"
    )
    api_token: Annotated[SecretStr | None, BlankIsUnset] = Field(
        default=None, description="bearer token for the conductor's API, if it requires one"
    )
    api_token_file: Annotated[Path | None, BlankIsUnset] = Field(
        default=None,
        description=(
            "file holding the bearer token instead (e.g. a projected ServiceAccount token), "
            "read again whenever it changes; not together with `RIG_API_TOKEN`"
        ),
    )
    heartbeat_interval_s: float = Field(
        description="seconds between heartbeats", default=10.0, gt=0
    )
    # One meaning on both sides: the reaper's period. Entries reclaimed to this agent land in
    # its pending list at most once a scan, so the agent re-reads the list at least that often.
    # Give the agent the conductor's value.
    scan_interval_s: float = Field(
        description=(
            "the reaper's period, as the conductor has it: entries reclaimed to this agent land "
            "in its pending list once a scan, so it re-reads that list at least this often"
        ),
        default=60.0,
        gt=0,
    )
    max_deliveries: int = Field(
        description=(
            "an entry delivered this many times is dead-lettered by the runtime, not handled again"
        ),
        default=5,
        ge=1,
    )
    # A handler with no progress for this long is abandoned (rule 4b, docs/rules.md); 0: off.
    entry_deadline_ms: int = Field(
        description=(
            "a handler with no progress for this long is abandoned (the reaper "
            "moves its entry); `0` turns it off"
        ),
        default=3_600_000,
        ge=0,
    )
    dispatch_stream: str = Field(
        description="the stream read when `--stream` is not given",
        default="rig:dispatch",
        min_length=1,
    )

    @field_validator("conductor_url")
    @classmethod
    def _conductor_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL:
            raise ValueError("is not a URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value.rstrip("/")

    @field_validator("api_token_file")
    @classmethod
    def _one_token_source(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        if info.data.get("api_token") is not None:
            raise ValueError("RIG_API_TOKEN and RIG_API_TOKEN_FILE are both set; set one of them")
        try:
            token_file.read_token(value)
        except token_file.TokenFileError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def token(self) -> str | None:
        return self.api_token.get_secret_value().strip() if self.api_token else None

    @property
    def lease_ttl_ms(self) -> int:
        """Lifetime of the consumer-name lease: three heartbeats, so one late renewal is fine."""
        return max(1, round(self.heartbeat_interval_s * 3000))

    def describe(self) -> dict[str, object]:
        """The effective configuration for the start-up log line, secrets masked."""
        shown: dict[str, object] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name == "api_token":
                value = "<set>" if value else None
            elif name in _SECRET_FIELDS and value is not None:
                value = _mask_url(str(value))
            shown[ENV_PREFIX + name.upper()] = value
        return shown


def _mask_url(value: str) -> str:
    scheme, sep, rest = value.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return value
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"


def load_agent_settings(**overrides: Any) -> AgentSettings:
    """Read the environment; raise SettingsError with one line naming the variable."""
    try:
        return AgentSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(explain(exc, secret=_SECRET_FIELDS)) from None
