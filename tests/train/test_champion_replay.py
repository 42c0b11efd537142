"""Rule 5 with a ``champion_eval`` tag: a retrained challenger is compared with the champion replayed on its windows."""

from __future__ import annotations

from rlsched.train.registry import CHAMPION_EVAL_TAG, ChampionReplay, check_promotion

WP = {"mean_jct_s": 7200.0, "cost_usd": 100.0, "jobs_completed": 50}
CANDIDATE = {"ppo": {"mean_jct_s": 3000.0, "cost_usd": 90.0, "jobs_completed": 50}, "weighted-priority": WP}
#: The champion's registered numbers, on its own (other) windows: better than the candidate's there.
CHAMPION = {"ppo": {"mean_jct_s": 1000.0, "cost_usd": 50.0}, "weighted-priority": WP}


def replay(jct: float, *, model: str | None = "m", version: int | None = 3,
           eval_set: str | None = "own") -> ChampionReplay:
    return ChampionReplay(model, version, {"ppo": {"mean_jct_s": jct, "cost_usd": 90.0, "jobs_completed": 50}},
                          eval_set)


def checks(rep: ChampionReplay | None, champion: tuple[str, int] | None = ("m", 3),
           candidate_set: str | None = "own", champion_set: str | None = "theirs") -> list[tuple[bool, str]]:
    return [(c.ok, c.text) for c in check_promotion(CANDIDATE, CHAMPION, candidate_eval_set=candidate_set,
                                                    champion_eval_set=champion_set, champion=champion,
                                                    champion_replay=rep)]


def test_without_the_tag_other_eval_sets_are_refused_as_before() -> None:
    out = checks(None)
    assert [ok for ok, _ in out] == [True, True, True, False, False, False]
    assert out[3][1] == "evaluation set differs from the champion's (own vs theirs): metrics are not comparable"
    assert out[4][1].startswith("mean JCT vs champion: candidate 3000 NOT < champion 1000")


def test_a_replay_of_the_current_champion_on_the_candidates_windows_is_compared_instead() -> None:
    better = checks(replay(4000.0))
    assert all(ok for ok, _ in better), better
    texts = [t for _, t in better]
    assert "comparing with m version 3 replayed on the candidate's evaluation windows" in texts[3]
    assert texts[4] == ("mean JCT vs champion replayed on the candidate's evaluation windows: "
                        "candidate 3000 < champion 4000")
    assert texts[5].startswith("cost vs champion replayed on the candidate's evaluation windows: candidate 90 <=")
    # worse than the replayed champion: refused on the numbers, and says which numbers
    worse = checks(replay(2500.0))
    assert [ok for ok, _ in worse] == [True, True, True, True, False, True]
    assert worse[4][1] == ("mean JCT vs champion replayed on the candidate's evaluation windows: "
                           "candidate 3000 NOT < champion 2500")


def test_a_stale_foreign_or_mismatched_replay_is_refused_as_not_comparable() -> None:
    cases = {
        "replays m version 2, not the champion m version 3": replay(4000.0, version=2),
        "replays other version 3, not the champion m version 3": replay(4000.0, model="other"),
        "replays a model folder, not the champion": replay(4000.0, model=None, version=None),
        "was measured on elsewhere, not on the candidate's evaluation set": replay(4000.0, eval_set="elsewhere"),
        "has no 'ppo' metrics": ChampionReplay("m", 3, {"fifo": {"mean_jct_s": 1.0}}, "own"),
    }
    for words, rep in cases.items():
        out = checks(rep)
        assert not out[3][0] and "metrics are not comparable" in out[3][1] and words in out[3][1], (words, out[3])
        # the champion's own numbers are what rule 4 then compares (as without the tag)
        assert out[4][1].startswith("mean JCT vs champion: ")
    # no champion identity known: the replay cannot be matched
    assert not checks(replay(4000.0), champion=None)[3][0]


def test_the_tag_is_only_consulted_when_the_eval_sets_differ() -> None:
    same = checks(replay(4000.0), champion_set="own")
    assert len(same) == 5 and same[3][1].startswith("mean JCT vs champion: candidate 3000 NOT < champion 1000")
    unknown = checks(replay(4000.0), candidate_set=None)
    assert len(unknown) == 5 and not unknown[3][0]


def test_the_tag_round_trips_and_malformed_tags_are_ignored() -> None:
    rep = replay(4000.0)
    assert ChampionReplay.parse(rep.tag()) == rep
    folder = replay(1.0, model=None, version=None)
    assert ChampionReplay.parse(folder.tag()) == folder
    for raw in (None, "", "not json", "[1]", '{"model": "m"}', rep.tag()[:-10]):
        assert ChampionReplay.parse(raw) is None, raw
    # a summary too big for one MLflow tag keeps the headline metrics only, still valid JSON
    big = ChampionReplay("m", 3, {"ppo": {"mean_jct_s": 1.0, "cost_usd": 2.0, **{f"x{i}": 1.5 for i in range(900)}}},
                         "own")
    small = ChampionReplay.parse(big.tag())
    assert small is not None and small.metrics == {"ppo": {"mean_jct_s": 1.0, "cost_usd": 2.0}}
    assert CHAMPION_EVAL_TAG == "champion_eval"
