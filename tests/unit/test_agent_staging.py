"""Staged writes: temporary names, the atomic rename, idempotent recovery, discarding."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rig_conductor.agent import staging
from rig_conductor.agent.entry import Entry
from rig_conductor.agent.staging import Committed, StagedFile, Staging


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


def test_the_intent_round_trips_through_its_text_form(tmp_path: Path) -> None:
    files = (_staged(tmp_path, "a b.txt", "x"), _staged(tmp_path, "ü.txt", "y"))
    assert staging.decode(staging.encode(files), entry_id="1-0", attempt=1) == files


@pytest.mark.parametrize(
    "pairs",
    [
        [["/etc/.passwd.1-0.a1.tmp", "/etc/passwd"], ["/tmp/victim", "/tmp/x"]],
        [["/srv/.out.1-0.a2.tmp", "/srv/out"]],  # another attempt's temporary
        [["/srv/.out.9-0.a1.tmp", "/srv/out"]],  # another entry's
        [["/srv/a/../.out.1-0.a1.tmp", "/srv/a/../out"]],
        [[".out.1-0.a1.tmp", "out"]],
        [["/srv/.out.1-0.a1.tmp", "/srv/out", "/x"]],
        [["/srv/\u0000.1-0.a1.tmp", "/srv/\u0000"]],
        [["/.1-0.a1.tmp", "/"]],
        {"a": "b"},
        [[1, 2]],
    ],
)
def test_an_intent_the_runtime_did_not_write_is_refused(pairs: object) -> None:
    with pytest.raises(ValueError):
        staging.decode(json.dumps(pairs), entry_id="1-0", attempt=1)
    assert staging.intent_key("rig:dispatch", "1-0") == "rig:staged:rig:dispatch:1-0"
