"""The Rewards page's decisions without Qt (studio.pages.rewards.controller): what the controls offer
while a job runs, why Apply cannot run yet, what a failure, a round and a step say, how a round's
answers are shown again, the adapter to continue and what changing it means, the ratings file, and
the jobs that open the rating session."""

from __future__ import annotations

import os
from types import SimpleNamespace as NS

import pytest

from engine import Answer, RoundResult, RunRecord
from studio.pages.rewards import controller as rewards
from studio.pages.rewards.controller import NEW_ADAPTER, RewardsController, StartChange


def session(step=0, **kw) -> NS:
    base = dict(step=step, answers=[], ratings=[], history=[], round=0, corrections={}, inputs={})
    return NS(**{**base, **kw})


def answer(i: int, text: str) -> Answer:
    return Answer(i, text, [1, 2], "eos")


def test_what_the_controls_offer_while_idle_and_busy():
    idle = rewards.controls("", has_session=True, pending=True)
    assert idle == rewards.Controls(idle=True, stop=False, session=True, apply=True)
    assert (
        rewards.controls("", has_session=False, pending=True).apply is False
    )  # no session: nothing to apply
    for kind in ("loading", "generating"):
        c = rewards.controls(kind, True, True)
        assert c.stop and not c.idle and not c.apply and not c.session  # Stop ends the generation
    for kind in ("applying", "comparing", "saving", "rounds", "scoring"):
        assert not rewards.controls(kind, True, True).stop
    assert rewards.round_pending(4, [False] * 4) and not rewards.round_pending(4, [True] * 4)
    assert not rewards.round_pending(0, [])


def test_apply_says_why_it_cannot_take_a_step():
    no_round = rewards.apply_problem(False, [], [], [], False)
    assert "no answers to train on" in no_round.text and no_round.level == "error"
    applied = rewards.apply_problem(True, ["rated"], [False], [True], False)
    assert "applied already" in applied.text and applied.level == "info"
    unrated = rewards.apply_problem(True, ["unrated", "skipped"], [False, False], [False, False], False)
    assert "Nothing is rated" in unrated.text and unrated.focus_cards
    assert rewards.apply_problem(True, ["unrated", "rated"], [False, False], [False] * 2, False) is None
    assert rewards.apply_problem(True, ["unrated"], [True], [False], False) is None  # a better answer
    assert rewards.apply_problem(True, ["unrated"], [False], [False], True) is None  # the checks scored


def test_texts_of_jobs_rounds_and_steps():
    assert rewards.busy_text("generating") == "Generating…" and rewards.busy_text("odd") == "odd"
    assert rewards.job_name("applying") == "applying the step"
    text = rewards.failure_text("saving", "disk full")
    assert (
        text
        == "Could not save the adapter: disk full. Choose another file name or folder with Save adapter…."
    )
    assert rewards.failure_text("other", "x") == "Could not other: x. "
    assert rewards.generated_status(2, 4, 7) == "Round 2: 4 answers (seed 7). Rate them, then Apply."
    done = RoundResult(
        round=1, step=3, prompt="p", mean_reward=0.5, loss=0.25, n_rated=2, weights=[], applied=True
    )
    assert rewards.applied_status(done) == (
        "Round 1 applied: step 3, loss 0.2500. Generate again for the next round.",
        None,
    )
    nan = RoundResult(
        round=1, step=3, prompt="p", mean_reward=0.5, loss=float("nan"), n_rated=2, weights=[], applied=True
    )
    assert "loss –" in rewards.applied_status(nan)[0]
    flat = RoundResult(
        round=2, step=3, prompt="p", mean_reward=0, loss=0, n_rated=4, weights=[], applied=False
    )
    status, warning = rewards.applied_status(flat)
    assert "no signal" in status and "all ratings were equal" in warning


def test_a_round_shown_again_keeps_its_ratings_corrections_and_lock():
    answers = [answer(0, "a"), answer(1, "b")]
    s = session(answers=answers, ratings=[1.0, None], corrections={1: "better"}, round=1, history=[])
    assert rewards.round_cards(answers, s) == [
        rewards.CardState(1.0, None, False),
        rewards.CardState(None, "better", False),
    ]
    s.history = [NS(round=1)]  # the round was applied
    assert all(c.locked for c in rewards.round_cards(answers, s))
    assert rewards.round_cards([answer(0, "new")], s) is None  # new answers: nothing to restore
    assert rewards.round_cards(answers, None) is None
    assert rewards.same_answers([(0, "x "), (1, "y"), (2, " x")]) == [[0, 2], [1]]


def test_the_adapter_to_continue_and_what_changing_it_means(tmp_path):
    ckpt = tmp_path / "ckpt-4"
    ckpt.mkdir()
    rewarded = RunRecord(
        name="r", kind="rewards", adapter=str(tmp_path / "r.gguf"), last_checkpoint=str(ckpt)
    )
    trained = RunRecord(name="t", adapter=str(tmp_path / "t.gguf"))
    assert rewards.start_path(NEW_ADAPTER, None) is None
    assert rewards.start_path(rewarded.adapter, rewarded) == str(ckpt)  # a reward run: its exact state
    assert rewards.start_path(trained.adapter, trained) == trained.adapter
    assert rewards.start_entry(None, []) == NEW_ADAPTER
    assert rewards.start_entry(str(ckpt), [trained, rewarded]) == rewarded.adapter  # listed as its run
    assert rewards.start_entry("/x.gguf", [trained]) == "/x.gguf"

    st = RewardsController()
    assert st.start_change(None, chosen=True, busy=False) is StartChange.SAME
    assert st.start_change("/a.gguf", chosen=True, busy=False) is StartChange.SET
    st.start_adapter = "/a.gguf"
    assert st.adopt(session(step=0), "/m.gguf") and st.session_start == "/a.gguf"
    assert not st.adopt(session(), "/other.gguf") and st.session_model == "/m.gguf"  # one session at a time
    assert st.start_change("/b.gguf", chosen=False, busy=False) is StartChange.KEEP  # a refresh of the list
    assert st.start_change("/b.gguf", chosen=True, busy=True) is StartChange.KEEP
    assert st.start_change("/b.gguf", chosen=True, busy=False) is StartChange.DROP  # no steps to lose
    st.session.step = 3
    assert st.start_change("/b.gguf", chosen=True, busy=False) is StartChange.ASK
    assert "Forget the 3 step(s)" in st.forget_question("b.gguf")
    st.drop()
    assert st.session is None and st.session_model is None and st.session_start is None


def test_what_the_adapter_box_says():
    st = RewardsController()
    assert st.adapter_text(8, 16.0, "all") == "A new adapter (rank 8, alpha 16, targets: all)"
    st.start_adapter = "/runs/r-checkpoints/ckpt-4/adapter.gguf"
    assert st.adapter_text(8, 16.0, "all") == "The next Generate continues <b>ckpt-4/adapter.gguf</b>"
    st.adopt(session(step=2), "/m")
    assert st.adapter_text(8, 16.0, "all") == (
        "Optimizer steps taken on this page from your ratings: <b>2</b> (continuing ckpt-4/adapter.gguf)"
    )
    st.session_start = None
    assert st.adapter_text(8, 16.0, "all").endswith("(a new adapter)")
    st.session.step = "<3>"  # the step is escaped with the rest of the text
    st.session_start = "/a&b.gguf"
    assert "a&amp;b.gguf" in st.adapter_text(8, 16.0, "all")


def test_the_ratings_file_and_checkpoints(tmp_path):
    st = RewardsController()
    out = str(tmp_path / "out")
    assert st.ratings_path(out) == os.path.join(out, "ratings.jsonl")
    assert st.checkpoint_dir(out) == os.path.join(os.path.abspath(out), "reward-checkpoints")
    st.custom_ratings_path = str(tmp_path / "mine" / "r.jsonl")
    assert st.checkpoint_dir(out) == str(tmp_path / "mine" / "reward-checkpoints")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert st.ratings_problem(str(model), {"model": str(model)})  # never a file the page reads
    assert model.read_bytes() == b"GGUF"  # and nothing was written to it
    ok = tmp_path / "ok.jsonl"
    assert st.ratings_problem(str(ok), {"model": str(model)}) is None and ok.exists()
    assert st.ratings_problem(str(model / "r.jsonl"), {})  # a folder that is a file
    st.custom_ratings_path = str(model / "r.jsonl")
    assert "cannot be written" in st.new_session_problem(out) and "Ratings file…" in st.new_session_problem(
        out
    )
    st.custom_ratings_path = None
    assert st.new_session_problem(out) is None
    st.adopt(session(), "/m")
    st.custom_ratings_path = str(model / "r.jsonl")
    assert st.new_session_problem(out) is None  # the session going on has its file already


def test_the_session_job_makes_the_session_once_and_keeps_it_when_the_work_fails():
    st = RewardsController()
    made, configured = [], []

    def maker(engine_session):
        made.append(engine_session)
        return session()

    job = st.session_job(maker, configured.append, lambda s: "answers")
    s, result, error = job("engine")
    assert made == ["engine"] and configured == [s] and (result, error) == ("answers", None)

    def fail(_s):
        raise MemoryError()

    s2, result, error = st.session_job(maker, configured.append, fail)("engine")
    assert s2 is not None and result is None and error.startswith("out of memory")  # the session is kept
    st.adopt(s, "/m")
    assert st.session_job(maker, configured.append, lambda s: s)("engine") == (s, s, None)
    assert len(made) == 2  # the page's session is used, not made again
    assert st.opener(maker, configured.append)("engine") is s

    def broken(engine_session):
        raise ValueError("no model")

    with pytest.raises(ValueError):  # a session that cannot be made fails the job itself
        RewardsController().session_job(broken, configured.append, lambda s: s)("engine")


def test_the_session_maker_reads_everything_when_it_is_made(tmp_path):
    st = RewardsController()
    st.start_adapter = "/a.gguf"
    cfg = NS(targets="T", rank=4, alpha=8.0, seed=3)
    maker = st.session_maker(cfg, "reward-config", str(tmp_path), "tmpl")
    st.start_adapter = "/later.gguf"  # a change after the click does not reach the job
    opened = []
    engine_session = NS(open_rewards=lambda **kw: opened.append(kw) or "session")
    assert maker(engine_session) == "session"
    paths = dict(
        ratings_path=str(tmp_path / "ratings.jsonl"), checkpoint_dir=str(tmp_path / "reward-checkpoints")
    )
    want = dict(
        adapter="/a.gguf", targets="T", rank=4, alpha=8.0, config="reward-config", template="tmpl", seed=3
    )
    assert opened == [{**want, **paths}]
