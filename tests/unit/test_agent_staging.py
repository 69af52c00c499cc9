"""Staged writes: temporary names, the atomic rename, idempotent recovery, discarding."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rig_conductor.agent import staging
from rig_conductor.agent.entry import Entry
from rig_conductor.agent.staging import Committed, StagedFile, Staging
from rig_conductor.domain import StagedOutput


def test_the_temporary_name_carries_entry_and_attempt_in_the_same_directory(
    tmp_path: Path,
) -> None:
    final = tmp_path / "reports" / "rc-959.md"
    tmp = staging.temp_path(final, entry_id="1700000000000-0", attempt=3)
    assert tmp == tmp_path / "reports" / ".rc-959.md.1700000000000-0.a3.tmp"


def test_long_names_stay_within_the_usual_limit(tmp_path: Path) -> None:
    tmp = staging.temp_path(tmp_path / ("x" * 255), entry_id="1700000000000-12", attempt=10)
    assert len(tmp.name) <= 255 and tmp.parent == tmp_path


def test_entry_stage_returns_a_writable_temporary_path(tmp_path: Path) -> None:
    entry = Entry("1-0", "rig:dispatch", "builders", "dev-e-0", 2, {"issueId": "rc-1"})
    tmp = entry.stage(tmp_path / "new" / "dir" / "out.txt")
    assert tmp == tmp_path / "new" / "dir" / ".out.txt.1-0.a2.tmp"
    assert tmp.parent.is_dir()  # created, so the handler can write straight away
    assert entry.stage(tmp_path / "new" / "dir" / "out.txt") == tmp  # same file, same path


def test_relative_paths_are_recorded_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    area = Staging(entry_id="1-0", attempt=1)
    area.stage("out.txt")
    assert area.close() == (StagedFile(tmp_path / ".out.txt.1-0.a1.tmp", tmp_path / "out.txt"),)


def test_staging_after_the_handler_returned_is_refused(tmp_path: Path) -> None:
    area = Staging(entry_id="1-0", attempt=1)
    area.close()
    with pytest.raises(RuntimeError):
        area.stage(tmp_path / "late.txt")


def test_staging_from_threads_records_every_file(tmp_path: Path) -> None:
    area = Staging(entry_id="1-0", attempt=1)
    threads = [threading.Thread(target=area.stage, args=(tmp_path / f"f{i}",)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(area.close()) == 20


def _staged(tmp_path: Path, name: str, text: str, attempt: int = 1) -> StagedFile:
    final = tmp_path / name
    tmp = staging.temp_path(final, entry_id="1-0", attempt=attempt)
    tmp.write_text(text)
    return StagedFile(tmp, final)


def test_commit_renames_onto_the_final_path_replacing_what_was_there(tmp_path: Path) -> None:
    a, b = _staged(tmp_path, "a.txt", "new a"), _staged(tmp_path, "b.txt", "new b")
    a.final.write_text("old a")
    staging.flush([a, b])
    assert staging.commit([a, b]) == Committed(renamed=2)
    assert a.final.read_text() == "new a" and b.final.read_text() == "new b"
    assert not a.tmp.exists() and not b.tmp.exists()


def test_commit_is_idempotent_and_finishes_a_half_done_commit(tmp_path: Path) -> None:
    """A crash between two renames: the next commit renames what is left, counts the rest."""
    a, b = _staged(tmp_path, "a.txt", "a"), _staged(tmp_path, "b.txt", "b")
    assert staging.commit([a]) == Committed(renamed=1)
    assert staging.commit([a, b]) == Committed(renamed=1, already=1)
    assert staging.commit([a, b]) == Committed(already=2)
    assert a.final.read_text() == "a" and b.final.read_text() == "b"


def test_commit_reports_files_that_are_gone_on_both_sides(tmp_path: Path) -> None:
    lost = StagedFile(tmp_path / ".x.1-0.a1.tmp", tmp_path / "x")
    assert staging.commit([lost]) == Committed(missing=1)
    assert not lost.final.exists()


def test_discard_removes_temporary_files_only(tmp_path: Path) -> None:
    a = _staged(tmp_path, "a.txt", "fenced")
    a.final.write_text("committed by the accepted attempt")
    assert staging.discard([a, a]) == 1
    assert not a.tmp.exists() and a.final.read_text() == "committed by the accepted attempt"


def test_leftovers_of_other_attempts_of_the_entry_are_removed(tmp_path: Path) -> None:
    accepted = _staged(tmp_path, "out.txt", "accepted", attempt=3)
    killed = [_staged(tmp_path, "out.txt", "killed", attempt=n).tmp for n in (1, 2, 10)]
    other_entry = staging.temp_path(accepted.final, entry_id="2-0", attempt=1)
    other_file = staging.temp_path(tmp_path / "else.txt", entry_id="1-0", attempt=1)
    not_ours = tmp_path / ".out.txt.1-0.ab.tmp"
    for path in (other_entry, other_file, not_ours):
        path.write_text("keep")
    assert staging.remove_leftovers([accepted], entry_id="1-0", keep_attempt=3) == 3
    assert not any(path.exists() for path in killed)
    assert accepted.tmp.exists()  # the accepted attempt's own file is committed, not removed
    assert other_entry.exists() and other_file.exists() and not_ours.exists()
    assert staging.remove_leftovers([accepted], entry_id="1-0", keep_attempt=3) == 0


def test_the_outputs_round_trip_through_their_wire_form(tmp_path: Path) -> None:
    files = (_staged(tmp_path, "a b.txt", "x"), _staged(tmp_path, "ü.txt", "y"))
    assert staging.from_outputs(staging.outputs(files), attempt=1) == files


@pytest.mark.parametrize(
    "pairs",
    [
        [("/etc/.passwd.1-0.a1.tmp", "/etc/passwd"), ("/tmp/victim", "/tmp/x")],
        [("/srv/.out.1-0.a2.tmp", "/srv/out")],  # another attempt's temporary
        [("/srv/a/../.out.1-0.a1.tmp", "/srv/a/../out")],
        [(".out.1-0.a1.tmp", "out")],
        [("/srv/\u0000.1-0.a1.tmp", "/srv/\u0000")],
        [("/.1-0.a1.tmp", "/")],
        [("/srv/other/.out.1-0.a1.tmp", "/srv/out")],  # not beside its path
        [("/srv/.out.x-0.a1.tmp", "/srv/out")],  # not an entry id
    ],
)
def test_outputs_the_runtime_did_not_stage_are_refused(pairs: list[tuple[str, str]]) -> None:
    """Recorded outputs steer a rename: each must be a staging temporary of its own path for
    the accepted attempt, or nothing is renamed."""
    recorded = [StagedOutput(staged, path) for staged, path in pairs]
    with pytest.raises(ValueError):
        staging.from_outputs(recorded, attempt=1)


def test_outputs_carried_to_a_new_entry_are_accepted(tmp_path: Path) -> None:
    """After Redis lost its data the dispatch lives on as a new entry: the accepted attempt's
    temporaries keep the old entry's id, and are still its own."""
    final = tmp_path / "out.txt"
    old = staging.temp_path(final, entry_id="1700000000000-0", attempt=2)
    assert staging.from_outputs([StagedOutput(str(old), str(final))], attempt=2) == (
        StagedFile(old, final),
    )
