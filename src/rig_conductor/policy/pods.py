"""Pod-state rules (reaper rules 3-4, docs/rules.md): what one Kubernetes answer about a pod means.

- a pod that exists and is Pending or Running is LIVE, also while terminating (deletionTimestamp
  set): its containers may still be acking until the pod object is removed;
- Succeeded or Failed is GONE; phase Unknown (node unreachable) or no phase is UNKNOWN;
- a watch event that says the pod was deleted is GONE, whatever phase it last had;
- when two answers about one pod race, the one that moves less work wins.

Pure: stdlib and domain only. Listing, watching and remembering pods is reaper/podwatch.py's.
"""

from __future__ import annotations

from rig_conductor.domain import PodState

LIVE_PHASES = frozenset({"Pending", "Running"})
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# How much work each answer can move: LIVE moves none, GONE lets the reaper reclaim at once.
_CAUTION = {PodState.LIVE: 0, PodState.UNKNOWN: 1, PodState.GONE: 2}


def pod_state(phase: str) -> PodState:
    """The state of a pod that exists, by its phase. A terminating pod is still LIVE: it may
    still ack, so `deletionTimestamp` does not matter here."""
    if phase in LIVE_PHASES:
        return PodState.LIVE
    if phase in FINISHED_PHASES:
        return PodState.GONE
    return PodState.UNKNOWN


def event_state(event_type: str, phase: str) -> PodState:
    """The state a watch event reports: a DELETED pod is GONE, any other event its phase's."""
    return PodState.GONE if event_type == "DELETED" else pod_state(phase)


def safer(first: PodState, second: PodState) -> PodState:
    """Of two racing answers about one pod (LIVE, UNKNOWN or GONE), the one that moves less
    work: a list that was in flight while the watch reported something newer must not
    overwrite it with a more destructive answer. Equal answers return `first`."""
    return min(first, second, key=_CAUTION.__getitem__)
