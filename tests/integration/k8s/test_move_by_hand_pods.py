"""A move by hand (console or API) judges its target by reaper rule 5 on the scan's own
evidence, the pod list included: a consumer whose pod is missing from a successful list, and
that never heartbeated by its own name, is refused (409) by both, and nothing moves.

The conductor app, the real kubernetes client and the API stand-in, real Redis and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.settings import Settings

from ..console_kit import OPERATOR, client_of, sign_in
from ..helpers import fill, owners, read, register
from .standin import KubeStandIn

S, G = "rig:dispatch", "workers"
OWNER, GHOST, LIVE = (f"dev-e-rig-agent-runtime-{n}" for n in range(3))
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


async def test_a_target_missing_from_the_pod_list_is_refused_by_console_and_api(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(
        streams=(S,),
        agent_ids=("dev-e",),
        operator_tokens=OPERATOR,
        k8s_namespace="agents",
        k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
    )
    ids = await fill(redis, S, G, 2)
    await read(redis, S, G, OWNER, 2)
    # GHOST registered itself (an idle time of its own), but its pod is gone from the list
    # and it never heartbeated by name; LIVE's pod is listed.
    await register(redis, S, G, GHOST)
    await register(redis, S, G, LIVE)
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("dev-e"), ConsumerName(OWNER))],
    )
    for name in (OWNER, LIVE):
        kube.add_pod(name, namespace="agents", labels=LABELS)
    app = create_app(settings, schedule_reaper=False, kube=api)
    bearer = {"Authorization": f"Bearer {OPERATOR}"}
    async for console in client_of(app):
        body = {"stream": S, "group": G, "entryIds": ids[:1], "to": GHOST}
        refused = await console.post("/api/moves", json=body, headers=bearer)
        assert refused.status_code == 409, refused.text
        assert GHOST in refused.json()["detail"]

        csrf = await sign_in(console, OPERATOR)
        form = {
            "csrf": csrf,
            "stream": S,
            "group": G,
            "consumer": OWNER,
            "target": GHOST,
            "entries": ids[:1],
        }
        page = await console.post("/ui/move", data=form)
        assert page.status_code == 409 and "not live" in page.text
        assert await owners(redis, S, G) == dict.fromkeys(ids, OWNER)

        moved = await console.post("/api/moves", json={**body, "to": LIVE}, headers=bearer)
        assert moved.status_code == 200, moved.text
        assert moved.json()["moved"] == ids[:1]
        assert (await owners(redis, S, G))[ids[0]] == LIVE
