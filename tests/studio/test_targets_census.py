"""The Targets page's routing census panel on its own: a count that is cancelled says so and shows
nothing; a census shown goes out of date when the data's settings change; a dense model has no panel."""

from __future__ import annotations

import json
from types import SimpleNamespace

from engine import Model, SynthSpec, write_model
from studio.pages.targets.census import CensusPanel
from studio.pages.targets.page import TargetsPage
from studio.project import ModelInfo, Project
from tests.engine.test_census import _model_with_unreached


class NowEngine:
    """Runs a job at once on the calling thread (the worker's contract, without the thread)."""

    def __init__(self, model: Model, stop: bool = False):
        self.session, self.stop, self.events = SimpleNamespace(model=model), stop, []

    def submit(self, name, fn, *, on_event=None, on_done=None, on_error=None, model=None, **_):
        job = SimpleNamespace(
            emit=lambda e: (self.events.append(e), on_event(e)), should_stop=lambda: self.stop
        )
        on_done(fn(self.session, job))
        return job

    def cancel(self, job):
        self.stop = True


def _data(tmp_path) -> str:
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"q {i}", "response": f"a {i}"} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_census_panel_cancel_and_out_of_date(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_STUDIO_DATA", str(tmp_path / "app"))
    path, unreached = _model_with_unreached(tmp_path)
    project = Project()
    project.update(model_path=path, dataset_path=_data(tmp_path))
    project.update_config(prompt_format="raw", n_ctx=64)
    engine = NowEngine(Model.load(path), stop=True)
    panel = CensusPanel(project, engine)
    qtbot.addWidget(panel)
    panel.count()
    assert panel.census is None and panel.status.text() == "Cancelled: nothing was counted."
    assert panel.count_button.isEnabled() and not panel.cancel_button.isVisible()
    engine.stop = False
    seen = []
    panel.sig_census.connect(seen.append)
    panel.count()
    assert panel.census is not None and panel.census.unreached() == unreached and seen == [panel.census]
    assert engine.events[-1].phase == "routing" and engine.events[-1].done == panel.census.n_tokens
    project.update_config(n_ctx=32)  # the data would be windowed otherwise: the census no longer applies
    panel.check_current()
    assert panel.census is None and seen[-1] is None
    assert "count the routing again" in panel.status.text()


def test_no_census_for_a_dense_model(qtbot, tmp_path):
    dense = write_model(tmp_path / "dense.gguf", SynthSpec.for_arch("llama", L=1))
    page = TargetsPage(Project())
    qtbot.addWidget(page)
    page.show()
    page.set_model_info(ModelInfo.read(dense))
    assert not page.census_panel.isVisible()
    moe, _ = _model_with_unreached(tmp_path)
    page.set_model_info(ModelInfo.read(moe))
    assert page.census_panel.isVisible() and not page.census_panel.count_button.isEnabled()  # no dataset yet
    assert "Choose a dataset" in page.census_panel.status.text()
