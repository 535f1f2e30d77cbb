"""`tune-studio`: starts the desktop app, optionally on the bundled demo model or a given file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tune-studio", description="Fine-tune GGUF models on your own machine.")
    ap.add_argument("model", nargs="?", help="a .gguf model to open")
    ap.add_argument("--demo", action="store_true", help="open the bundled demo model")
    ap.add_argument("--screenshot", metavar="DIR", help="write DIR/<page>.png of each page and exit")
    args = ap.parse_args(argv)

    from PySide6.QtWidgets import QApplication

    from .main_window import MainWindow
    from .resources import DEMO_MODEL

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Tune Studio")
    window = MainWindow()
    path = args.model or (str(DEMO_MODEL) if args.demo else None)
    if path:
        window.model_page.open_path(path)
    window.show()
    if args.screenshot:
        out = Path(args.screenshot)
        out.mkdir(parents=True, exist_ok=True)
        app.processEvents()
        window.grab().save(str(out / "model.png"))
        return 0
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
