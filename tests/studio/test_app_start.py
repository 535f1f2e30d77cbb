"""`tune-studio` on a machine that cannot open a window: a missing system library of Qt's xcb plugin, or
no display at all, is said in one line with what to do, and the app exits with code 1 before Qt starts
(instead of Qt's "Could not load the Qt platform plugin" abort)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import studio.app as app_module
from studio.app import (
    GUI_LIBRARIES,
    XCB_LIBRARIES,
    can_load,
    display_problem,
    main,
    no_display,
    qt_platform,
)

X11 = {"DISPLAY": ":0"}


def missing(*sonames: str):
    """A fake loader for which these libraries are not installed."""
    return lambda soname: soname not in sonames


@pytest.fixture
def user(monkeypatch):
    monkeypatch.setattr(app_module.os, "geteuid", lambda: 1000, raising=False)


def test_a_missing_xcb_library_is_named_with_the_command_that_installs_it(user, monkeypatch):
    line = display_problem(X11, "linux", missing("libxcb-cursor.so.0", "libxcb-icccm.so.4"))
    assert line is not None and "\n" not in line
    assert "libxcb-cursor.so.0" in line and "libxcb-icccm.so.4" in line
    assert "xcb platform plugin" in line
    assert line.endswith(
        "install with: sudo apt-get update && sudo apt-get install -y libxcb-cursor0 libxcb-icccm4"
    )
    monkeypatch.setattr(app_module.os, "geteuid", lambda: 0, raising=False)  # root: no sudo there
    line = display_problem(X11, "linux", missing("libxcb-cursor.so.0"))
    assert line.endswith("install with: apt-get update && apt-get install -y libxcb-cursor0")


def test_a_missing_gl_library_is_named_whatever_the_platform(user):
    env = {"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}
    line = display_problem(env, "linux", missing("libEGL.so.1", "libxcb-cursor.so.0"))
    assert line is not None and "libEGL.so.1" in line and line.endswith("sudo apt-get install -y libegl1")
    assert "libxcb-cursor" not in line  # offscreen does not load the xcb plugin


def test_nothing_is_said_when_the_window_can_open():
    assert display_problem(X11, "linux", missing()) is None
    assert display_problem({}, "darwin", missing("libGL.so.1")) is None  # the check is for Linux
    wayland = {"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}
    assert qt_platform(wayland) == "wayland"
    assert display_problem(wayland, "linux", missing("libxcb-cursor.so.0")) is None  # Qt uses Wayland
    assert qt_platform({"DISPLAY": ":0", "QT_QPA_PLATFORM": "xcb:nomitshm"}) == "xcb"


def test_no_display_says_how_to_run_without_one():
    line = display_problem({}, "linux", missing())
    assert line is not None and "\n" not in line
    assert "DISPLAY" in line and "WAYLAND_DISPLAY" in line
    assert "xvfb-run" in line and "--screenshot" in line
    # --screenshot goes offscreen by itself where there is no display (and only there)
    assert no_display({}, "linux") and not no_display(X11, "linux")
    assert not no_display({"QT_QPA_PLATFORM": "offscreen"}, "linux") and not no_display({}, "win32")


def test_the_app_exits_with_code_1_and_one_line_before_qt_starts(user, monkeypatch, capsys):
    monkeypatch.setenv("DISPLAY", ":0")
    for name in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(app_module.sys, "platform", "linux")
    monkeypatch.setattr(app_module, "can_load", missing("libxcb-cursor.so.0"))
    import studio.main_window

    monkeypatch.setattr(
        studio.main_window, "MainWindow", lambda *a, **k: pytest.fail("a window was made despite the check")
    )
    assert main(["--demo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sudo apt-get install -y libxcb-cursor0" in err[0]


def test_the_real_loader_finds_what_is_installed_and_only_that():
    assert can_load("libc.so.6")
    assert not can_load("libtune-studio-no-such-library.so.7")


def test_the_list_covers_what_the_installed_xcb_plugin_needs():
    """Every system library the installed PySide6's xcb plugin (and its Qt libraries) links to
    directly is in the check, with a package to install (Qt's own libraries ship in the wheel)."""
    import PySide6

    readelf = shutil.which("readelf")
    qt = Path(PySide6.__file__).parent / "Qt"
    files = [qt / "plugins/platforms/libqxcb.so", qt / "lib/libQt6XcbQpa.so.6", qt / "lib/libQt6Gui.so.6"]
    if readelf is None or not all(f.exists() for f in files):
        pytest.skip("needs readelf and PySide6's Linux libraries")
    needed: set[str] = set()
    for f in files:
        out = subprocess.run([readelf, "-d", str(f)], capture_output=True, text=True, check=True).stdout
        needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out))
    base = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1", "libgthread-2.0.so.0"}
    system = {n for n in needed if not n.startswith("libQt6") and not n.startswith("libicu")} - base
    listed = {soname for soname, _ in GUI_LIBRARIES + XCB_LIBRARIES}
    assert system <= listed, f"not checked: {sorted(system - listed)}"


def test_the_readme_installs_every_package_the_check_asks_for():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    command = re.search(r"sudo apt-get update && sudo apt-get install -y (.*?)```", readme, flags=re.S)
    assert command is not None
    listed = set(command.group(1).replace("\\", " ").split())
    assert listed == {package for _, package in GUI_LIBRARIES + XCB_LIBRARIES}
