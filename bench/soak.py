"""Soak: long runs that look for memory growth, leaked threads and leaked file handles, not speed.

    python bench/soak.py train [--steps 2000] [--every 50]   # one 2,000-step run of the demo
    python bench/soak.py app [--minutes 30]                 # the app, scripted, for 30 minutes

`train` opens the demo model in an engine session (as `tune-engine train` and the app do) and trains
the demo's persona (its LoRA on every matmul, the app's demo settings) for --steps steps with a
checkpoint every 250 and every event appended to an events log, sampling the process's resident
memory (RSS), threads and open file handles every --every steps.

`app` builds the real main window (offscreen unless a display is set: Xvfb works too) on the demo
project and repeats what a person does, until --minutes have passed: train the demo (150 steps,
Train page), chat with the new adapter (Chat page), generate four answers, rate them and apply the
step (Rewards page), export the adapter as F16 and verify it (Export page), open the Runs page and
refresh it. It samples RSS, threads and handles after every round, then closes the window and checks
that the engine's thread has ended. `--trace` also follows Python's own allocations (tracemalloc,
slower): the traced total after every round, and at the end the lines whose allocations grew most
since the warm-up, so a growth can be told apart from memory outside Python (Qt, BLAS, the heap).

Both print a table of samples and a verdict: growth of RSS after the warm-up (the first 10% of the
steps or of the rounds, at least two rounds) beyond 10%, or more threads or file handles at the end than after
the warm-up, is reported as a failure (exit status 1). Run them one at a time, on a machine that is
otherwise quiet enough not to time out the app's waits; figures are not timings.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROWTH_LIMIT = 0.10  # RSS may grow this much after the warm-up
STEP_NAMES = ("train", "chat", "rate", "export", "runs")  # a round of the app session


@dataclass(frozen=True)
class Sample:
    at: str  # "step 200", "round 3"
    seconds: float  # since the soak started
    rss: int  # bytes resident
    threads: int  # the process's threads (/proc/self/task)
    python_threads: int  # threading.active_count()
    handles: int  # open file descriptors (/proc/self/fd)


def sample(at: str, t0: float) -> Sample:
    with open("/proc/self/statm", encoding="ascii") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return Sample(
        at,
        time.monotonic() - t0,
        rss,
        len(os.listdir("/proc/self/task")),
        threading.active_count(),
        len(os.listdir("/proc/self/fd")),
    )


def report(samples: list[Sample], warm: int, what: str) -> int:
    """Print the samples and the verdict; 1 when memory grew past the limit or threads or handles
    leaked after the warm-up (samples[warm - 1] is the last warm-up sample)."""
    print(f"\n{'sample':>12} {'s':>8} {'RSS MiB':>9} {'threads':>8} {'py thr':>7} {'handles':>8}")
    for s in samples:
        print(
            f"{s.at:>12} {s.seconds:8.0f} {s.rss / 2**20:9.1f} {s.threads:8d} {s.python_threads:7d} "
            f"{s.handles:8d}"
        )
    base = samples[warm - 1]
    after = samples[warm:]
    peak = max(after, key=lambda s: s.rss)
    last = samples[-1]
    growth, end = peak.rss / base.rss - 1, last.rss / base.rss - 1
    mib = 2**20
    print(
        f"\n{what}: RSS {base.rss / mib:.1f} MiB after the warm-up ({base.at}), peak {peak.rss / mib:.1f} "
        f"MiB after it ({peak.at}, {growth:+.1%}), last {last.rss / mib:.1f} MiB ({end:+.1%}); "
        f"threads {base.threads} -> {last.threads}, file handles {base.handles} -> {last.handles}"
    )
    failures = []
    if growth > GROWTH_LIMIT:
        failures.append(f"RSS grew {growth:.1%} after the warm-up (limit {GROWTH_LIMIT:.0%})")
    if last.threads > base.threads:
        failures.append(f"{last.threads - base.threads} more threads at the end")
    if last.handles > base.handles:
        failures.append(f"{last.handles - base.handles} more open file handles at the end")
    print(
        "verdict: "
        + ("; ".join(failures) if failures else "no growth beyond the limit, no leaked threads or handles")
    )
    return 1 if failures else 0


# --- train ---------------------------------------------------------------------------------------------


def soak_train(steps: int, every: int) -> int:
    from dataclasses import replace

    from engine import AppendLog, EngineSession, Step, TargetSpec, TrainConfig, event_to_json
    from studio.app import DEMO_SETTINGS
    from studio.resources import DEMO_DATASET, DEMO_MODEL

    t0 = time.monotonic()
    samples = [sample("opened", t0)]
    with tempfile.TemporaryDirectory(prefix="tune-soak-") as tmp:
        out = os.path.join(tmp, "soak.gguf")
        session = EngineSession(str(DEMO_MODEL))
        config = replace(
            TrainConfig(targets=TargetSpec(preset="all"), **DEMO_SETTINGS),
            steps=steps,
            checkpoint_every=250,
            checkpoint_dir=os.path.join(tmp, "soak.checkpoints"),
            out=out,
        )
        session.new_run(str(DEMO_DATASET), config)
        samples.append(sample("step 0", t0))
        log = AppendLog(os.path.join(tmp, "events.jsonl"))
        warm_step = max(every, steps // 10 // every * every)
        losses: list[float] = []

        def on_event(e) -> None:
            log.write((event_to_json(e) + "\n").encode("utf-8"))
            if isinstance(e, Step):
                losses.append(e.mean_ce)
                if e.step % every == 0 or e.step == steps:
                    samples.append(sample(f"step {e.step}", t0))
                    print(
                        f"  step {e.step}/{steps}  loss {e.mean_ce:.4f}  "
                        f"RSS {samples[-1].rss / 2**20:.1f} MiB",
                        flush=True,
                    )

        result = session.train(on_event)
        log.close()
        del session
        samples.append(sample("closed", t0))
        print(
            f"\n{type(result).__name__} after {result.step} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
            f"{time.monotonic() - t0:.0f} s"
        )
    warm = next(i for i, s in enumerate(samples) if s.at == f"step {warm_step}") + 1
    return report(samples, warm, f"{steps}-step demo run")


# --- app -----------------------------------------------------------------------------------------------


def soak_app(minutes: float, steps: tuple[str, ...] = STEP_NAMES, trace: bool = False) -> int:
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from engine import TargetSpec
    from studio.app import DEMO_SETTINGS, collect_on_ui_thread
    from studio.main_window import PAGES, MainWindow
    from studio.resources import DEMO_DATASET, DEMO_MODEL

    app = QApplication.instance() or QApplication(sys.argv[:1])
    collect_on_ui_thread(app)  # as the app does: Python's GC on the UI thread
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="tune-soak-app-")
    window = MainWindow(
        QSettings(os.path.join(tmp, "settings.ini"), QSettings.IniFormat),
        recovery_dir=os.path.join(tmp, "recovery"),
    )
    window.confirm = lambda title, text: True
    window.ask_unsaved = lambda text: "discard"
    window.rewards_page.confirm = lambda title, text: True
    window.show()
    window.start_project(
        model=str(DEMO_MODEL),
        dataset=str(DEMO_DATASET),
        output_dir=os.path.join(tmp, "runs"),
        config=dict(targets=TargetSpec(preset="all"), **DEMO_SETTINGS),
    )

    def wait(signal, start, seconds: float, what: str, error=None):
        """Call start(); wait for `signal` (its arguments), or fail on the page's `error` signal or
        after `seconds`."""
        got: list = []
        failed: list[str] = []
        loop = QEventLoop()

        def done(*args) -> None:
            got.append(args)
            loop.quit()

        def errored(message: str) -> None:
            failed.append(message)
            loop.quit()

        signal.connect(done)
        if error is not None:
            error.connect(errored)
        try:
            if start() is False:
                raise RuntimeError(f"{what}: could not start")
            timer = QTimer()
            timer.setSingleShot(True)
            timer.timeout.connect(loop.quit)
            timer.start(int(seconds * 1000))
            if not got and not failed:
                loop.exec()
            timer.stop()
        finally:
            signal.disconnect(done)
            if error is not None:
                error.disconnect(errored)
        if failed:
            raise RuntimeError(f"{what}: {failed[0]}")
        if not got:
            raise RuntimeError(f"{what}: nothing after {seconds:.0f} s")
        return got[0]

    def settle(seconds: float = 0.3) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    state: dict = {"adapter": None}

    def train(state: dict) -> None:
        window.show_page(PAGES.index("Train"))
        (result,) = wait(window.train_page.sig_run_finished, window.train_page.start, 600, "training")
        if type(result).__name__ != "Finished":
            raise RuntimeError(f"training ended with {result}")
        state["adapter"] = result.adapter_path

    def chat(state: dict) -> None:
        page = window.chat_page
        window.show_page(PAGES.index("Chat"))
        page.new_chat()  # one conversation per round: a person's chats do not run past the context
        page.input.setPlainText("What is your name?")
        wait(page.sig_answered, page.send, 120, "chatting", page.sig_error)

    def rate(state: dict) -> None:
        page = window.rewards_page
        window.show_page(PAGES.index("Rewards"))
        if page.session is not None and not page.is_busy():
            page.new_adapter()  # each round rates the adapter of its own run
        page.set_adapter(state["adapter"])
        page.set_prompt("What does a fish say?")
        (answers,) = wait(page.sig_generated, page.generate, 120, "generating answers", page.sig_error)
        for i, value in zip(range(len(answers)), (1.0, -1.0, 0.5, -0.5), strict=False):
            page.rate(i, value)
        wait(page.sig_round_applied, page.apply, 120, "applying the ratings", page.sig_error)

    def export(state: dict) -> None:
        page = window.export_page
        window.show_page(PAGES.index("Export"))
        page.set_adapter(state["adapter"])
        page.type_combo.setCurrentIndex(page.type_combo.findData("F16"))
        page.out_edit.setText(os.path.join(tmp, "exported.f16.gguf"))  # replaced every round
        wait(page.sig_exported, page.export, 120, "exporting")

    def runs(state: dict) -> None:
        window.show_page(PAGES.index("Runs"))
        window.runs_page.refresh()

    STEPS = {"train": train, "chat": chat, "rate": rate, "export": export, "runs": runs}
    if window.model_page.opening:
        wait(window.sig_model_changed, lambda: None, 120, "opening the demo")
    if any(s != "train" for s in steps) and "train" not in steps:  # the other steps need an adapter
        train(state)
    samples = [sample("opened", t0)]
    problems: list[str] = []
    deadline = t0 + minutes * 60
    rounds = 0
    if trace:
        import tracemalloc

        tracemalloc.start(6)
        warm_snapshot = None
    while time.monotonic() < deadline:
        rounds += 1
        try:
            for step in steps:
                STEPS[step](state)
            settle()
        except RuntimeError as exc:
            problems.append(f"round {rounds}: {exc}")
            settle(2.0)
        samples.append(sample(f"round {rounds}", t0))
        s = samples[-1]
        print(
            f"  round {rounds} at {s.seconds:.0f} s: RSS {s.rss / 2**20:.1f} MiB, {s.threads} threads, "
            f"{s.handles} handles, {len(window.runs_page.runs())} runs listed"
            + (f", Python {tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB traced" if trace else ""),
            flush=True,
        )
        if trace and rounds == 2:
            warm_snapshot = snapshot()
    if trace and warm_snapshot is not None:
        print_growth(warm_snapshot, snapshot())
    window.project.dirty = False
    closed = window.close()
    settle(1.0)
    samples.append(sample("closed", t0))
    print(
        f"\n{rounds} rounds in {(time.monotonic() - t0) / 60:.1f} min; window closed: {closed}; "
        f"engine thread ended: {window.engine._thread.isFinished()}"
    )
    for p in problems:
        print(f"problem: {p}")
    # the warm-up: the first tenth of the rounds (as `train` takes the first tenth of the steps), at
    # least two; the first rounds fill the allocator's arenas, Qt's and pyqtgraph's caches
    warm = min(max(3, 1 + rounds // 10), len(samples) - 1)
    code = report(samples[:-1], warm, f"{rounds}-round app session")
    if warm > 3:
        early, last = samples[2], samples[-2]
        print(f"(from {early.at}, the growth was {last.rss / early.rss - 1:+.1%}: the warm-up included)")
    if problems or not window.engine._thread.isFinished():
        code = 1
    return code


def snapshot():
    """tracemalloc's snapshot of what is alive: garbage waiting for the collector (the app collects on
    a timer) would read as growth."""
    import gc
    import tracemalloc

    gc.collect()
    return tracemalloc.take_snapshot()


def print_growth(before, after, top: int = 25) -> None:
    """The source lines whose live allocations grew most between two tracemalloc snapshots, each with
    the innermost frames of the repository's code that led there."""
    import tracemalloc

    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen*")]
    diff = after.filter_traces(keep).compare_to(before.filter_traces(keep), "traceback")
    total = sum(d.size_diff for d in diff)
    print(f"\nPython allocations since the warm-up: {total / 2**20:+.2f} MiB; the largest growths:")
    for d in sorted(diff, key=lambda d: d.size_diff, reverse=True)[:top]:
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(d.traceback))
        print(f"  {d.size_diff / 2**10:+9.1f} KiB {d.count_diff:+7d} blocks  {where}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train", help="one long run of the demo")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--every", type=int, default=50, help="steps between samples (default 50)")
    a = sub.add_parser("app", help="the app, scripted: train, chat, rate, export, runs, repeat")
    a.add_argument("--minutes", type=float, default=30.0)
    a.add_argument(
        "--only",
        help="comma-separated steps of each round (default train,chat,rate,export,runs): to find "
        "which step a growth comes from",
    )
    a.add_argument("--trace", action="store_true", help="follow Python's allocations (tracemalloc)")
    args = ap.parse_args(argv)
    if args.what == "train":
        return soak_train(args.steps, args.every)
    steps = tuple(args.only.split(",")) if args.only else STEP_NAMES
    return soak_app(args.minutes, steps, args.trace)


if __name__ == "__main__":
    sys.exit(main())
