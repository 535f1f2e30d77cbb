"""The Train page on preference pairs: the objective setting (DPO / ORPO, beta, lambda), the step total
counted in pairs, a DPO run whose figures fill the Preferences tab live (log-probabilities, margin,
training and held-out accuracy), and Start refused with the reason when the dataset has no pairs."""

from __future__ import annotations

import json

import numpy as np

from engine import Finished
from studio.dataset_document import DatasetDocument
from tests.studio.test_train_page import checked, make_page, run, settle

WORDS = "the of and to in is you that it he was for on are as with his they at be this have from".split()


def _pairs(path, n=16):
    rng = np.random.default_rng(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            q = " ".join(rng.choice(WORDS, 3))
            f.write(
                json.dumps({"prompt": q, "chosen": f"yes {q.split()[0]}", "rejected": f"no {q.split()[0]}"})
            )
            f.write("\n")
    return str(path)


def test_the_objective_settings_keep_the_config_valid(qtbot, engine, tmp_path, synth_model):
    prefs = _pairs(tmp_path / "prefs.jsonl")
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), prefs, reward_mode="group")
    editors, project = page.settings.editors, page.project
    assert not editors["dpo_beta"].isEnabled() and not editors["orpo_lambda"].isEnabled()
    editors["objective"].setCurrentIndex(editors["objective"].findData("dpo"))
    assert (project.config.objective, project.config.reward_mode) == ("dpo", "none")  # pairs carry no rewards
    assert editors["dpo_beta"].isEnabled() and not editors["orpo_lambda"].isEnabled()
    editors["dpo_beta"].setValue(0.25)
    assert project.config.dpo_beta == 0.25
    editors["reward_mode"].setCurrentIndex(editors["reward_mode"].findData("weighted"))
    assert (project.config.objective, project.config.reward_mode) == ("sft", "weighted")
    assert "Default: 0.1." in editors["dpo_beta"].toolTip() and "reference" in editors["objective"].toolTip()


def test_a_dpo_run_fills_the_preferences_tab_and_counts_pairs(qtbot, engine, tmp_path, synth_model, chats):
    prefs = _pairs(tmp_path / "prefs.jsonl")
    doc = DatasetDocument()
    doc.open(prefs)
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), prefs, dataset=doc, steps=8, n_ctx=64,
                     batch_size=4, val_split=0.25, eval_every=4, lr=2e-2, objective="dpo")  # fmt: skip
    checked(qtbot, page)
    plan = page.check.plan
    assert plan.n_trainable == 12 and plan.batches_per_epoch == 3 and plan.total_steps == 8
    assert "12 training / 4 validation preference pairs" in page.stats_label.text()
    tabs = page.plots.tabs
    assert not tabs.isTabVisible(tabs.indexOf(page.preference_plots))
    result = run(qtbot, page)
    settle(qtbot, page)
    page.preference_plots.redraw(everything=True)
    assert isinstance(result, Finished) and result.step == 8
    assert tabs.isTabVisible(tabs.indexOf(page.preference_plots))
    assert tabs.currentWidget() is page.preference_plots  # shown when the run starts
    assert "DPO" in page.plots.loss_plot.texts[0]
    data = page.preference_plots.curve_data()
    for key in ("chosen_logp", "rejected_logp", "margin", "accuracy"):
        assert list(data[key][0]) == list(range(1, 9)), key
    assert list(data["val_accuracy"][0]) == [4, 8]
    x, margin = data["margin"]
    assert margin[-1] > margin[0] and data["val_accuracy"][1][-1] >= 0.75
    chosen, rejected = data["chosen_logp"][1], data["rejected_logp"][1]
    assert chosen[-1] - rejected[-1] > chosen[0] - rejected[0]
    log = page.log.toPlainText()
    assert "held-out pairs at step 4: accuracy" in log and "pairs: accuracy" in log
    assert "held-out pairs (4) at step 8" in page.preference_plots.caption.text()
    # a preference objective on a dataset without pairs: Start says why and where to fix it
    page.project.update(dataset_path=chats)
    doc.open(chats)
    checked(qtbot, page)
    reason = page.reason_label.text()
    assert not page.start_button.isEnabled() and "learns from preference pairs" in reason
    assert 'href="page:Dataset"' in reason
    # back to SFT: the plain loss and no Preferences tab on the next run
    page.project.update_config(objective="sft", n_ctx=128)
    checked(qtbot, page)
    run(qtbot, page)
    settle(qtbot, page)
    assert not tabs.isTabVisible(tabs.indexOf(page.preference_plots))
    assert tabs.currentWidget() is not page.preference_plots
    assert page.plots.loss_plot.texts[0] == "Loss (mean cross-entropy)"


def test_a_preference_run_trains_in_one_process(qtbot, engine, tmp_path, synth_model):
    """Processes above 1 with DPO: Start says why it is unavailable, and "Across machines…" refuses
    (the engine trains a pair's two answers in one process); Processes at 1 allows Start again."""
    prefs = _pairs(tmp_path / "prefs.jsonl")
    page = make_page(qtbot, engine, tmp_path, synth_model("llama"), prefs, objective="dpo", n_ctx=64)
    checked(qtbot, page)
    assert page.start_button.isEnabled()
    page.processes.setValue(2)
    assert not page.start_button.isEnabled()
    assert (
        "DPO trains in one process" in page.reason_label.text()
        and "set Processes to 1" in page.reason_label.text()
    )
    assert not page.start()
    assert page.show_machines() is None and "trains in one process" in page.banner_text()
    page.processes.setValue(1)
    assert page.start_button.isEnabled()
    page.project.update_config(objective="sft")
    page.processes.setValue(2)
    assert "one process" not in page.reason_label.text()
