"""The vocabularies in `domain` cannot drift from what the database allows, from the SQL text
that still spells states and kinds out, or from the event types the API publishes."""

from __future__ import annotations

import importlib.util
import io
import re
import typing
from pathlib import Path

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from pydantic import TypeAdapter
from sqlalchemy import CheckConstraint, Table

from rig_conductor.adapters.postgres import tables
from rig_conductor.api import errors, schemas
from rig_conductor.domain import AssignmentState, EventKind

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "src" / "rig_conductor"
STATES = {state.value for state in AssignmentState}
API_TYPES = {
    "HEARTBEAT",
    "ISSUE_ASSIGNED",
    "WORK_STARTED",
    "WORK_PROGRESS",
    "WORK_COMPLETED",
    "WORK_FAILED",
    "WORK_PUBLISHED",
    "DEAD_LETTER",
}
_CHECK = re.compile(r"CONSTRAINT (ck_\w+_state) CHECK \(state IN \(([^)]*)\)\)")


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", text))


def _migrated_sql() -> str:
    """Every migration's upgrade, in order, as the PostgreSQL it sends (Alembic offline mode)."""
    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name="postgresql", opts={"as_sql": True, "output_buffer": buffer}
    )
    with Operations.context(context):
        for path in sorted((REPO / "migrations" / "versions").glob("[0-9]*.py")):
            spec = importlib.util.spec_from_file_location(f"_migration_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.upgrade()
    return buffer.getvalue()


def test_assignment_states_are_what_the_migrated_database_allows() -> None:
    latest: dict[str, set[str]] = {}
    for name, values in _CHECK.findall(_migrated_sql()):
        latest[name] = _quoted(values)  # a later migration's constraint replaces the earlier
    assert set(latest) == {"ck_assignments_state", "ck_group_assignments_state"}
    for name, allowed in latest.items():
        assert allowed == STATES, name


@pytest.mark.parametrize("table", [tables.assignments, tables.group_assignments])
def test_assignment_states_are_what_the_table_models_check(table: Table) -> None:
    checks = [c for c in table.constraints if isinstance(c, CheckConstraint)]
    assert len(checks) == 1
    assert _quoted(str(checks[0].sqltext)) == STATES


def _sources() -> list[tuple[str, str]]:
    return [(str(p.relative_to(SOURCE)), p.read_text()) for p in sorted(SOURCE.rglob("*.py"))]


def test_states_spelled_out_in_sql_are_assignment_states() -> None:
    """The statements that keep literals for readability name only states the enum has."""
    compared = re.compile(r"\bstate\s*(?:=|<>|!=)\s*'([^']*)'")
    listed = re.compile(r"\bstate\s+(?:NOT\s+)?IN\s*\(([^)]*)\)")
    found: dict[str, set[str]] = {}
    for path, text in _sources():
        values = set(compared.findall(text))
        for group in listed.findall(text):
            values |= _quoted(group)
        if values:
            found[path] = values
    assert found, "no SQL literal found: the pattern no longer matches the statements"
    assert {name: values - STATES for name, values in found.items() if values - STATES} == {}


def test_kinds_spelled_out_in_sql_are_event_kinds() -> None:
    kinds = {kind.value for kind in EventKind}
    compared = re.compile(r"\bkind\s*(?:=|<>|!=)\s*'([^']*)'")
    found = {path: set(compared.findall(text)) for path, text in _sources()}
    assert any(found.values())
    assert {name: values - kinds for name, values in found.items() if values - kinds} == {}


def _type_literals() -> list[object]:
    """The `type` values of every member of the API's event union, as the models declare them."""
    union = typing.get_args(schemas.Event)[0]
    values: list[object] = []
    for model in typing.get_args(union):
        values += typing.get_args(model.model_fields["type"].annotation)
    return values


def test_the_api_event_types_are_event_kinds() -> None:
    values = _type_literals()
    assert all(isinstance(value, EventKind) for value in values)
    assert {str(value) for value in values} == API_TYPES
    assert errors._TAGS == API_TYPES


def test_the_published_schema_lists_the_event_types_as_plain_strings() -> None:
    """What `/openapi.json` shows clients: the kinds' values, never the enum's names or reprs."""
    schema = TypeAdapter(schemas.Event).json_schema()
    published: set[str] = set()
    for model in schema["$defs"].values():
        field = model.get("properties", {}).get("type")
        if field is not None:
            published |= {field["const"]} if "const" in field else set(field["enum"])
    assert published == API_TYPES
