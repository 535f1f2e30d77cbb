"""`tune-studio`: starts the desktop app, optionally on the bundled demo model or a given file.

Before Qt starts, `display_problem` checks that a window can open at all: on Linux, that there is a
display, and that the system libraries Qt's xcb platform plugin loads are installed (a plain
Debian/Ubuntu box lacks libxcb-cursor0 and friends, and Qt would abort with "Could not load the Qt
platform plugin xcb"); when one is missing the app says which, and the command that installs them,
and exits with code 1.

`--screenshot DIR` opens each page in turn, writes DIR/<page>.png, and exits (offscreen when there is
no display); with `--demo` it first trains the demo (150 steps) so that the Train page shows real
curves. Otherwise the window first offers to restore the unsaved changes a crash left behind
(`MainWindow.offer_recovery`).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# one click trains the demo's persona in about twenty seconds on two CPU cores; its dataset mixes the
# world's own facts in (resources/demo/make_dataset.py), so the demo keeps answering them
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

# System libraries PySide6's Qt loads, with the Debian/Ubuntu package of each (the NEEDED entries of
# PySide6 6.11's libQt6Gui.so.6 and of plugins/platforms/libqxcb.so with libQt6XcbQpa.so.6; Qt 6 no
# longer loads libxcb-xinerama). Qt itself (libQt6*, ICU) ships in the wheel.
GUI_LIBRARIES: tuple[tuple[str, str], ...] = (  # every platform, offscreen included
    ("libGL.so.1", "libgl1"),
    ("libEGL.so.1", "libegl1"),
    ("libfontconfig.so.1", "libfontconfig1"),
    ("libfreetype.so.6", "libfreetype6"),
    ("libxkbcommon.so.0", "libxkbcommon0"),
    ("libX11.so.6", "libx11-6"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
    ("libdbus-1.so.3", "libdbus-1-3"),
)
XCB_LIBRARIES: tuple[tuple[str, str], ...] = (  # the xcb platform plugin (X11 desktops)
    ("libxcb.so.1", "libxcb1"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-render.so.0", "libxcb-render0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libxcb-shape.so.0", "libxcb-shape0"),
    ("libxcb-shm.so.0", "libxcb-shm0"),
    ("libxcb-sync.so.1", "libxcb-sync1"),
    ("libxcb-util.so.1", "libxcb-util1"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libxcb-xkb.so.1", "libxcb-xkb1"),
)


def can_load(soname: str) -> bool:
    """Whether the dynamic loader finds and loads this shared library (as Qt's plugin loader would)."""
    try:
        ctypes.CDLL(soname, mode=getattr(os, "RTLD_LAZY", 1) | getattr(os, "RTLD_LOCAL", 0))
    except OSError:
        return False
    return True


def qt_platform(env: Mapping[str, str]) -> str | None:
    """The platform plugin Qt will pick on Linux: "xcb", "wayland", another name set in
    QT_QPA_PLATFORM ("offscreen", ...), or None when there is no display at all."""
    chosen = env.get("QT_QPA_PLATFORM", "").strip()
    if chosen:
        return chosen.split(";")[0].split(":")[0].strip()
    if env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland":
        return "wayland"
    if env.get("DISPLAY"):
        return "xcb"
    if env.get("WAYLAND_DISPLAY"):
        return "wayland"
    return None


def no_display(env: Mapping[str, str], platform: str | None = None) -> bool:
    """Linux without a display (and no platform chosen in QT_QPA_PLATFORM)."""
    platform = sys.platform if platform is None else platform
    return platform.startswith("linux") and qt_platform(env) is None


def display_problem(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    loader: Callable[[str], bool] | None = None,
) -> str | None:
    """Why Qt could not open a window here, as one line with what to do, or None when it can: no
    display (Linux), or system libraries Qt needs that are not installed (with the apt-get command
    that installs them). `loader(soname) -> bool` is `can_load`, replaced in tests."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    loader = can_load if loader is None else loader
    if not platform.startswith("linux"):
        return None
    qpa = qt_platform(env)
    if qpa is None:
        return (
            "tune-studio: no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set): "
            "run it in a desktop session, under a virtual X server (xvfb-run tune-studio --demo), or "
            "write the pages as pictures without a window (tune-studio --demo --screenshot DIR)"
        )
    needed = list(GUI_LIBRARIES) + (list(XCB_LIBRARIES) if qpa == "xcb" else [])
    missing = [(soname, package) for soname, package in needed if not loader(soname)]
    if not missing:
        return None
    xcb = {soname for soname, _ in XCB_LIBRARIES}
    what = "Qt's xcb platform plugin (X11) needs" if any(s in xcb for s, _ in missing) else "Qt needs"
    names = ", ".join(soname for soname, _ in missing)
    packages = " ".join(dict.fromkeys(package for _, package in missing))
    sudo = "" if getattr(os, "geteuid", lambda: 1)() == 0 else "sudo "  # root has no sudo on a bare box
    return (
        f"tune-studio: cannot open a window: {what} {names}, not installed; "
        f"install with: {sudo}apt-get update && {sudo}apt-get install -y {packages}"
    )


def collect_on_ui_thread(app) -> None:
    """The app's rule for Python's cyclic collector (`studio.ui_gc.UiCollector`): never automatic,
    on the UI thread from a timer, no full collection while a dataset is read. Benchmarks of the
    window call this too, or they measure stalls the app does not have."""
    from .ui_gc import UiCollector

    UiCollector.install(app)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tune-studio", description="Fine-tune GGUF models on your own machine.")
    ap.add_argument("path", nargs="?", help="a .gguf model, .jsonl dataset or .json project to open")
    ap.add_argument(
        "--demo", action="store_true", help="open the bundled demo model and dataset, ready to train"
    )
    ap.add_argument("--screenshot", metavar="DIR", help="write DIR/<page>.png of each page and exit")
    ap.add_argument(
        "--theme",
        choices=("system", "light", "dark"),
        help="the window's colours (default: the one chosen last in View > Theme, else system)",
    )
    args = ap.parse_args(argv)

    if args.screenshot and no_display(os.environ):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # pictures of the pages need no display
    problem = display_problem()
    if problem:  # said here, in one line, instead of Qt's abort
        print(problem, file=sys.stderr)
        return 1

    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from engine import TargetSpec

    from .main_window import PAGES, MainWindow
    from .resources import DEMO_DATASET, DEMO_MODEL

    app = QApplication.instance() or QApplication(sys.argv[:1])
    collect_on_ui_thread(app)
    app.setApplicationName("Tune Studio")
    app.setOrganizationName("TuneStudio")
    settings = (
        QSettings(str(Path(args.screenshot) / "settings.ini"), QSettings.IniFormat)
        if args.screenshot
        else None
    )
    window = MainWindow(settings)
    if args.theme:
        window.set_theme(args.theme)
    if not args.screenshot:
        # unsaved changes autosaved before a crash: offered before anything else is opened
        window.show()
        window.offer_recovery()
    if args.demo:
        # runs of the demo go to its runs home in the app's data folder (or beside the screenshots),
        # never into the install
        window.start_project(
            model=str(DEMO_MODEL),
            dataset=str(DEMO_DATASET),
            output_dir=str(Path(args.screenshot) / "runs") if args.screenshot else None,
            config=dict(targets=TargetSpec(preset="all"), **DEMO_SETTINGS),
        )
    if args.path:
        # a file named on the command line is what the person opens: the project is not changed by it
        suffix = Path(args.path).suffix.lower()
        if suffix == ".gguf":
            window.start_project(model=args.path)
        elif suffix == ".jsonl" and os.path.isfile(args.path):
            window.open_any(args.path)
            window.project.dirty = False
            window._update_title()
        else:
            window.open_any(args.path)
    window.show()
    if not args.screenshot:
        code = app.exec()
        # Everything is written by now (runs end with their checkpoint before the window closes,
        # files are renamed into place, the settings are synced below): leave without tearing down
        # the interpreter's objects one by one, which took 1.5 s with a model open
        window.settings.sync()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

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
