"""`tune-engine`, the headless command line."""

from .main import main

__all__ = ["main"]
