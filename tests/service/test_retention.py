"""History retention's file removal against the settle that renames exit files as it goes."""

from __future__ import annotations

from pathlib import Path

from rlsched.service.retention import remove_files


def test_an_exit_file_renamed_seen_after_the_listing_is_removed_too(tmp_path: Path) -> None:
    # The sweep lists the log directory, then removes each pruned job's files; the settle that recorded
    # the job renames its exit file *.seen just after its commit, which may fall in between. Removing only
    # the listed name left the .seen file behind for good (and CI's retention test waited for it in vain).
    log, exit_file = tmp_path / "j-1.log", tmp_path / "j-1.exit.json"
    log.write_text("x\n")
    exit_file.write_text("{}")
    listed = [str(log), str(exit_file)]
    exit_file.rename(exit_file.with_name(exit_file.name + ".seen"))  # consume_exits, after the listing
    remove_files(listed)
    assert not list(tmp_path.iterdir())


def test_files_under_their_listed_names_go_and_missing_ones_are_no_error(tmp_path: Path) -> None:
    kept = tmp_path / "j-2.exit.json.seen"  # another job's: never touched
    kept.write_text("{}")
    exit_file = tmp_path / "j-1.exit.json"
    exit_file.write_text("{}")
    remove_files([str(tmp_path / "j-1.log"), str(exit_file)])  # its log is already gone
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]
