"""The main window. For now it holds the Model page; the other pages of the design (Dataset,
Targets, Train, Rewards, Export) join it as they are built."""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow

from .model_page import ModelPage


class MainWindow(QMainWindow):
    def __init__(self):
        super().__init__()
        self.setWindowTitle("Tune Studio")
        self.resize(1000, 700)
        self.model_page = ModelPage()
        self.setCentralWidget(self.model_page)
        self.model_page.sig_model_opened.connect(self._opened)
        self.model_page.sig_error.connect(
            lambda msg: self.statusBar().showMessage("Could not open the model", 8000)
        )

        open_action = QAction("&Open model…", self)
        open_action.setShortcut(QKeySequence.Open)
        open_action.triggered.connect(self.model_page.choose_file)
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence.Quit)
        quit_action.triggered.connect(self.close)
        menu = self.menuBar().addMenu("&File")
        menu.addAction(open_action)
        menu.addSeparator()
        menu.addAction(quit_action)
        self.statusBar().showMessage("Device: CPU (NumPy)")
        settings = QSettings("TuneStudio", "TuneStudio")
        geometry = settings.value("main/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)

    def _opened(self, path: str) -> None:
        s = self.model_page.summary
        self.setWindowTitle(f"Tune Studio — {path}")
        self.statusBar().showMessage(
            f"Device: CPU (NumPy)   Model: {s.config.arch}, {s.n_params:,} parameters"
        )

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        QSettings("TuneStudio", "TuneStudio").setValue("main/geometry", self.saveGeometry())
        super().closeEvent(event)
