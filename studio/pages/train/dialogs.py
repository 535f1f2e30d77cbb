"""What the Train page asks and tells outside itself: the question before resuming a run with other
settings or data (`ask_resume`), and the alert when a long run ends (`EndAlert`: the window, the
system tray when there is one, the window's status line); and `wait_while`, the wait for a run to
end while the window keeps painting."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from PySide6.QtCore import QEventLoop, QTimer, SignalInstance
from PySide6.QtWidgets import QApplication, QMainWindow, QMessageBox, QStyle, QSystemTrayIcon, QWidget


def ask_resume(parent: QWidget, text: str, run_data: bool) -> str:
    """ "run" (continue the run as it was), "page" (with the page's settings and data) or "cancel";
    run_data False: the run's data is gone, so only the page's can go on."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Question)
    box.setWindowTitle("Resume the run")
    box.setText(text)
    as_was = box.addButton("Continue the run as it was", QMessageBox.AcceptRole) if run_data else None
    page = box.addButton("Use the page's settings", QMessageBox.DestructiveRole)
    box.addButton(QMessageBox.Cancel)
    box.setDefaultButton(as_was or page)
    box.exec()
    clicked = box.clickedButton()
    return "run" if clicked is as_was and as_was is not None else "page" if clicked is page else "cancel"


class EndAlert:
    """Tells that a long run ended: alerts the window, shows a tray message when there is a tray (the
    tray icon is made at the first alert), and says it in the window's status line."""

    def __init__(self, owner: QWidget):
        self.owner = owner
        self.tray: QSystemTrayIcon | None = None

    def show(self, text: str) -> None:
        window = self.owner.window()
        QApplication.alert(window)
        if QSystemTrayIcon.isSystemTrayAvailable():
            if self.tray is None:
                icon = window.windowIcon()
                if icon.isNull():
                    icon = self.owner.style().standardIcon(QStyle.SP_ComputerIcon)
                self.tray = QSystemTrayIcon(icon, self.owner)
                self.tray.messageClicked.connect(lambda: (window.raise_(), window.activateWindow()))
            self.tray.show()
            self.tray.showMessage("Tune Studio", text, QSystemTrayIcon.Information, 15_000)
            QTimer.singleShot(20_000, self.tray, self.tray.hide)
        if isinstance(window, QMainWindow):
            window.statusBar().showMessage(text, 30_000)

    def hide(self) -> None:
        if self.tray is not None:
            self.tray.hide()


def wait_while(busy: Callable[[], bool], signals: Iterable[SignalInstance], timeout_s: float) -> bool:
    """Wait until `busy()` is False, looking again at each of `signals`, at most `timeout_s`; the
    window keeps painting (input waits). True when it is not busy any more."""
    loop = QEventLoop()
    signals = tuple(signals)
    done = lambda *_: loop.quit() if not busy() else None  # noqa: E731
    for signal in signals:
        signal.connect(done)
    timer = QTimer()
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)
    timer.start(int(timeout_s * 1000))
    if busy():
        loop.exec(QEventLoop.ExcludeUserInputEvents)
    timer.stop()
    for signal in signals:
        signal.disconnect(done)
    return not busy()
