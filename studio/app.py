"""`tune-studio`: starts the desktop app, optionally on the bundled demo model or a given file.

`--screenshot DIR` opens each page in turn, writes DIR/<page>.png, and exits; with `--demo` it
first trains the demo (150 steps) so that the Train page shows real curves. Otherwise the window
first offers to restore the unsaved changes a crash left behind (`MainWindow.offer_recovery`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# one click trains the demo's persona in about twenty seconds on two CPU cores
DEMO_SETTINGS = dict(
    rank=8,
    alpha=16.0,
    lr=3e-3,
    steps=150,
    n_ctx=128,
    batch_size=4,
    schedule="cosine",
    warmup_steps=5,
    norms_every=2,
    checkpoint_every=0,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tune-studio", description="Fine-tune GGUF models on your own machine.")
    ap.add_argument("path", nargs="?", help="a .gguf model, .jsonl dataset or .json project to open")
    ap.add_argument(
        "--demo", action="store_true", help="open the bundled demo model and dataset, ready to train"
    )
    ap.add_argument("--screenshot", metavar="DIR", help="write DIR/<page>.png of each page and exit")
    args = ap.parse_args(argv)

    from pyqtgraph.util.garbage_collector import GarbageCollector
    from PySide6.QtCore import QEventLoop, QSettings, QStandardPaths, QTimer
    from PySide6.QtWidgets import QApplication

    from engine import TargetSpec

    from .main_window import PAGES, MainWindow
    from .resources import DEMO_DATASET, DEMO_MODEL

    app = QApplication.instance() or QApplication(sys.argv[:1])
    # Python's cyclic GC may otherwise run in a worker thread and destroy Qt objects there, which
    # crashes Qt; collect on the UI thread from a timer instead (pyqtgraph's recipe)
    app.gui_gc = GarbageCollector(interval=0.5)
    app.setApplicationName("Tune Studio")
    app.setOrganizationName("TuneStudio")
    settings = (
        QSettings(str(Path(args.screenshot) / "settings.ini"), QSettings.IniFormat)
        if args.screenshot
        else None
    )
    window = MainWindow(settings)
    if not args.screenshot:
        # unsaved changes autosaved before a crash: offered before anything else is opened
        window.show()
        window.offer_recovery()
    if args.demo:
        # runs of the demo go to the user's data folder (or beside the screenshots), never into the install
        runs = (
            Path(args.screenshot) / "runs"
            if args.screenshot
            else Path(QStandardPaths.writableLocation(QStandardPaths.AppLocalDataLocation)) / "demo-runs"
        )
        window.project.update(output_dir=str(runs))
        window.open_model(str(DEMO_MODEL))
        window.open_dataset(str(DEMO_DATASET))
        window.project.update_config(targets=TargetSpec(preset="all"), **DEMO_SETTINGS)
        window.project.dirty = False
    if args.path:
        window.open_any(args.path)
    window.show()
    if not args.screenshot:
        return app.exec()

    out = Path(args.screenshot)
    out.mkdir(parents=True, exist_ok=True)
    if window.model_page.opening:  # the model opens in the engine worker: show its facts
        loop = QEventLoop()
        window.sig_model_changed.connect(lambda _: loop.quit())
        window.model_page.sig_error.connect(lambda _: loop.quit())
        QTimer.singleShot(120_000, loop.quit)
        if window.model_page.opening:
            loop.exec()
    if args.demo:
        loop = QEventLoop()
        window.train_page.sig_run_finished.connect(lambda _: loop.quit())
        window.show_page(PAGES.index("Train"))
        if window.train_page.start():
            QTimer.singleShot(300_000, loop.quit)  # never hang a screenshot run
            loop.exec()
    if args.demo:
        # a rating round on the Rewards page: four answers to a prompt the demo answers variously
        page = window.rewards_page
        page.set_prompt("What does a fish say?")
        window.show_page(PAGES.index("Rewards"))
        loop = QEventLoop()
        page.sig_generated.connect(lambda _: loop.quit())
        if page.generate():
            QTimer.singleShot(120_000, loop.quit)
            loop.exec()
            for i, value in enumerate((1.0, -1.0, 0.5)):
                if i < len(page.session.answers if page.session else []):
                    page.rate(i, value)
    for i, name in enumerate(PAGES):
        window.show_page(i)
        for _ in range(5):
            app.processEvents()
        window.grab().save(str(out / f"{name.lower()}.png"))
    window.project.dirty = False
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
