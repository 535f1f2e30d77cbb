"""UI responsiveness while a large dataset opens: the longest time the window's UI thread could not run.

Opens a generated chat dataset (100,000 samples by default, as bench/data.py writes them) in the
real main window with a model open (the demo model: token counts are made for every row), as
File > Open dataset does, while a QTimer on the UI thread fires every 5 ms and records the gaps
between its timeouts (studio.train_probe.StallProbe). Then searches the samples for a word,
sorts by token count, and selects a problem, as a person would. Prints the longest gap per
phase, the UI thread's longest piece of work (its own CPU time between two ticks: a gap longer
than that was spent waiting for the interpreter or for a core that other programs held), the
time until the rows show, until every row is counted, and each step's time. Prints figures;
never passes or fails.

    python bench/dataset_stall.py                    # 100,000 samples, offscreen
    python bench/dataset_stall.py --samples 20000
    xvfb-run -a -s "-screen 0 1600x1000x24" python bench/dataset_stall.py --show --shot /tmp/ds.png
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--show" not in sys.argv:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import studio  # noqa: E402,F401  (first, as in the app: its OpenBLAS setting must precede NumPy)
from bench.data import write_chats  # noqa: E402


def wait(app, until, timeout_s: float) -> float:
    """Run the event loop until `until()` (checked every 5 ms) or the timeout; the seconds taken."""
    from PySide6.QtCore import QEventLoop, QTimer

    t = time.perf_counter()
    loop = QEventLoop()
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: (until() or time.perf_counter() - t > timeout_s) and loop.quit())
    timer.start()
    loop.exec()
    timer.stop()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--data", help="a dataset to open instead of a generated one")
    ap.add_argument("--no-model", action="store_true", help="open no model (no token counts)")
    ap.add_argument("--show", action="store_true", help="a real window (with xvfb-run) instead of offscreen")
    ap.add_argument("--shot", help="save a screenshot of the window after each step: PATH-<step>.png")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each step")
    args = ap.parse_args(argv)

    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtWidgets import QApplication

    from studio.app import collect_on_ui_thread
    from studio.main_window import MainWindow
    from studio.resources import DEMO_MODEL
    from studio.train_probe import StallProbe

    app = QApplication.instance() or QApplication(sys.argv[:1])
    collect_on_ui_thread(app)  # as the app does (automatic collections in the reader stalled 100-240 ms)
    work = Path(tempfile.mkdtemp(prefix="dataset-stall-"))
    os.environ.setdefault("TUNE_STUDIO_DATA", str(work / "data"))
    data = Path(args.data) if args.data else work / "chats.jsonl"
    if not args.data:
        t = time.perf_counter()
        write_chats(data, args.samples)
        size = data.stat().st_size / 2**20
        print(f"wrote {args.samples:,} samples ({size:.0f} MiB) in {time.perf_counter() - t:.1f} s")
    window = MainWindow(QSettings(str(work / "settings.ini"), QSettings.IniFormat))
    window.ask_unsaved = lambda text: "discard"
    window.resize(1400, 900)
    window.show()
    if not args.no_model:
        window.open_model(str(DEMO_MODEL))
        wait(app, lambda: window.model_info is not None, 60)
    wait(app, lambda: False, 0.5)  # first paint
    page = window.dataset_page
    shots = 0

    probe = StallProbe(5)

    def shot(step: str) -> None:
        nonlocal shots
        if args.shot:
            shots += 1
            with probe.paused():  # the grab is for the record, not part of what is measured
                window.grab().save(f"{args.shot.removesuffix('.png')}-{shots}-{step}.png")

    probe.start("opening")
    t0 = time.perf_counter()
    page.open_path(str(data))
    opened_s = time.perf_counter() - t0
    rows_s = wait(app, lambda: page.model.rowCount() >= 1 and not page.loading, args.timeout) + opened_s
    shot("opened")
    probe.mark("counting tokens")
    counted_s = wait(app, lambda: page.model.fully_counted(), args.timeout) + rows_s
    shot("counted")
    probe.mark("searching")
    t = time.perf_counter()
    page.search.setText("question 4242")
    narrowed = lambda: not page.busy() and page.proxy.rowCount() < page.model.rowCount()  # noqa: E731
    searched_s = wait(app, narrowed, args.timeout)
    search_rows = page.proxy.rowCount()
    shot("searched")
    page.search.setText("")
    wait(app, lambda: page.proxy.rowCount() == page.model.rowCount() and not page.busy(), args.timeout)
    probe.mark("sorting")
    t = time.perf_counter()
    page.table.sortByColumn(page.model.COL_TOKENS, Qt.DescendingOrder)
    sorted_s = wait(app, lambda: not page.busy(), args.timeout) + (time.perf_counter() - t)
    shot("sorted")
    probe.mark("problems")
    t = time.perf_counter()
    n_problems = page.problems_count()
    if n_problems:
        page.select_problem_at(n_problems // 2)
    problem_s = wait(app, lambda: not page.busy(), 5) + (time.perf_counter() - t)
    shot("problem")
    probe.stop()
    phases = ", ".join(f"{k} {v:.1f}" for k, v in probe.phase_max_ms().items())
    bounds = [*probe.phases, (len(probe.busy), "")]
    busy = ", ".join(
        f"{name} {1000 * max(probe.busy[i:j], default=0.0):.1f}"
        for (i, name), (j, _) in zip(bounds[:-1], bounds[1:], strict=True)
    )
    model = "none" if args.no_model else DEMO_MODEL.name
    print(
        f"{page.model.rowCount():,} samples, model {model}, Qt platform {app.platformName()}, "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n"
        f"  open_path returned in {opened_s * 1000:.0f} ms; rows shown after {rows_s:.1f} s; "
        f"every row's tokens counted after {counted_s:.1f} s\n"
        f"  search: {search_rows:,} rows in {searched_s:.2f} s; sort by tokens {sorted_s:.2f} s; "
        f"{n_problems:,} problems, one selected in {problem_s:.2f} s\n"
        f"  max UI stall {probe.max_gap_ms:.1f} ms (p99 {probe.percentile(99):.1f} ms, "
        f"{probe.n_ticks} ticks); max by phase (ms): {phases}\n"
        f"  the UI thread's longest piece of work {probe.max_busy_ms:.1f} ms; by phase (ms): {busy}",
        flush=True,
    )
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
