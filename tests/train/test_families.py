"""Evaluation families: windows cut around what a model saw, and what its card says it saw."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rlsched.train.families import (
    MIN_WINDOW_JOBS,
    FamilyError,
    GeneratorFamily,
    TraceFamily,
    exposure,
    families,
    family_key,
    resolve,
)

ROOT = Path(__file__).resolve().parents[2]

#: A bundled trace, so these tests need no ../shared/data.
SAMPLE = TraceFamily("philly-sample", "the bundled 3-day Philly sample on 4 x 8 V100", "bundled:philly-3day.csv",
                     "4x8xV100-16GB", 1.0, 12.0)


def _files(path: str) -> list[str]:
    return ["philly-3day.csv"] if "philly" in path else ["other.csv"]


def test_trace_windows_never_overlap_what_the_model_saw() -> None:
    card = {"scenarios": [{"scenario": "envs/philly.yaml", "train_window_h": [0, 30],
                           "eval_windows_h": [[40, 52]]}]}
    status, avoid = exposure(card, SAMPLE, trace_files=_files)
    assert status == "unseen" and avoid == [(0.0, 30.0), (40.0, 52.0)]
    worlds = SAMPLE.windows(10, avoid=avoid)
    assert worlds
    for w in worlds:
        assert w.end_h - w.start_h == 12.0
        assert all(not (w.start_h < b and w.end_h > a) for a, b in avoid), w.label
        assert len(w.scenario.jobs) >= MIN_WINDOW_JOBS
    starts = sorted(w.start_h for w in worlds)
    assert all(b - a >= 12.0 for a, b in itertools.pairwise(starts))  # windows are disjoint
    # The same trace under another model's card: windows may start anywhere.
    free = SAMPLE.windows(10)
    assert min(w.start_h for w in free) < 30.0


def test_job_windowed_family_of_a_seen_trace_is_marked_not_cut_around() -> None:
    fam = TraceFamily("sample-jobs", "", "bundled:philly-3day.csv", "4x8xV100-16GB", 1.0, 0.0, window_jobs=200)
    trained = {"scenarios": [{"scenario": "philly.yaml", "train_window_h": [0, 10]}]}
    tuned = {"holdout": [{"scenario": "philly.yaml", "eval_windows_h": [[0, 10]]}]}
    assert exposure(trained, fam, trace_files=_files) == ("trained", [])
    assert exposure(tuned, fam, trace_files=_files) == ("tuned", [])
    assert exposure({"scenarios": [{"scenario": "x.yaml", "train_window_h": [0, 10]}]}, fam,
                    trace_files=_files) == ("unseen", [])
    worlds = fam.windows(4)
    assert worlds and all(len(w.scenario.jobs) == 200 for w in worlds)
    ids = [{j.job_id for j in w.scenario.jobs} for w in worlds]
    assert all(not (a & b) for i, a in enumerate(ids) for b in ids[i + 1:])  # disjoint blocks of jobs


def test_an_anonymous_family_drops_every_tenant_and_keeps_the_rest() -> None:
    anon = TraceFamily("sample-anon", "", "bundled:philly-3day.csv", "4x8xA100-80GB", 1.0, 12.0, anonymous=True)
    named = TraceFamily("sample-named", "", "bundled:philly-3day.csv", "4x8xA100-80GB", 1.0, 12.0)
    a, n = anon.windows(2), named.windows(2)
    assert a and [w.label.split("/")[1] for w in a] == [w.label.split("/")[1] for w in n]
    for wa, wn in zip(a, n, strict=True):
        assert {j.user for j in wa.scenario.jobs} == {""}
        assert len({j.user for j in wn.scenario.jobs}) > 1
        strip = [(j.job_id, j.submit_time, j.duration, j.num_gpus) for j in wn.scenario.jobs]
        assert [(j.job_id, j.submit_time, j.duration, j.num_gpus) for j in wa.scenario.jobs] == strip
    shipped = families()["philly-anon"]
    assert isinstance(shipped, TraceFamily) and shipped.anonymous and shipped.path.endswith("philly_jobs.csv")


def test_generator_family_windows_are_evaluation_seeds() -> None:
    fam = families()["gen-gang"]
    assert isinstance(fam, GeneratorFamily) and family_key(fam) == "gen-gang"
    worlds = fam.windows(3, max_jobs=120)
    assert [w.label for w in worlds] == ["gang/seed1000", "gang/seed1001", "gang/seed1002"]
    assert all(len(w.scenario.jobs) == 120 for w in worlds)
    assert exposure({"families": ["gang"]}, fam) == ("trained", [])
    assert exposure({}, fam) == ("unseen", [])


def test_resolve_groups_dedupes_and_names_unknown() -> None:
    fams = resolve(["generated", "gen-gang"])
    assert [f.kind for f in fams] == ["generator"] * len(fams)
    assert len({family_key(f) for f in fams}) == len(fams)
    with pytest.raises(FamilyError, match="unknown family 'gen-gangs' \\(did you mean 'gen-gang'\\?\\)"):
        resolve(["gen-gangs"])


def test_missing_trace_is_a_family_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLSCHED_DATA", str(tmp_path))
    fam = families()["philly-late"]
    assert not fam.available()
    with pytest.raises(FamilyError, match=r"philly_jobs\.csv not found"):
        fam.windows(2)


def test_the_default_models_card_keeps_its_training_period_out() -> None:
    import json

    card = json.loads((ROOT / "models" / "default" / "card.json").read_text())
    fam = families()["philly-early"]
    status, avoid = exposure(card, fam)
    assert status == "unseen"
    assert (0.0, 1800.0) in avoid  # the default model trained on Philly's first 1800 h
    assert exposure(card, families()["openb"])[0] == "tuned"  # its holdout replays openb


def test_generated_training_worlds_are_seeded_draws_below_the_evaluation_seeds() -> None:
    from rlsched.train.families import generated_training_worlds, trained_generator_families

    a = generated_training_worlds(4, 50, seed=10, exclude=("gang", "overload"))
    b = generated_training_worlds(4, 50, seed=10, exclude=("gang", "overload"))
    assert [w.label for w in a] == [w.label for w in b] and len(a) == 4
    assert all(w.scenario.jobs == v.scenario.jobs for w, v in zip(a, b, strict=True))
    assert all(len(w.scenario.jobs) == 50 and w.entry == "generated" for w in a)
    assert all(j.num_gpus <= 8 for w in a for j in w.scenario.jobs)  # gangs excluded
    assert all(w.scenario.source.rsplit(":", 1)[1] in {"10", "11", "12", "13"} for w in a)
    assert "gang" not in trained_generator_families(("gang",)) and "bursty" in trained_generator_families(("gang",))


def test_named_family_training_worlds_are_training_seed_draws_of_the_family() -> None:
    from rlsched.train.families import GeneratorFamily, named_family_training_worlds, trained_generator_families

    worlds = named_family_training_worlds(("tiny-fleet", "steady"), 2, 60, seed=7)
    assert [w.label for w in worlds] == ["generated/tiny-fleet/seed7/train", "generated/tiny-fleet/seed8/train",
                                         "generated/steady/seed7/train", "generated/steady/seed8/train"]
    # the very draws the benchmark would make with those seeds - and the benchmark's own start at 1000
    same = GeneratorFamily("tiny-fleet", "").windows(1, 60, seed0=7)[0]
    assert worlds[0].scenario.jobs == same.scenario.jobs and len(worlds[0].scenario.jobs) == 60
    assert worlds[0].scenario.jobs != GeneratorFamily("tiny-fleet", "").windows(1, 60)[0].scenario.jobs
    # a family drawn by name is trained, even one the fleet cap would keep unseen
    assert "large-fleet" not in trained_generator_families(("gang",), max_nodes=32)
    assert "large-fleet" in trained_generator_families(("gang",), max_nodes=32, named=("large-fleet",))
