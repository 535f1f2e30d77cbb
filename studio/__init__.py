"""Tune Studio desktop app (PySide6)."""
