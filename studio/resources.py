"""Paths of the files shipped in resources/ (demo model, sample dataset)."""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
DEMO_MODEL = RESOURCES / "demo" / "demo.gguf"
DEMO_DATASET = RESOURCES / "demo" / "dataset.jsonl"
