"""Exceptions raised at the engine's boundary.

Each carries a message that names the offending value and what would have been
accepted, so that the CLI and the studio can show it to a person as it is.
This module holds no logic beyond the exception types.
"""


class EngineError(Exception):
    """Base class of every error the engine reports to its callers."""


class ModelError(EngineError):
    """A model file cannot be used: unreadable, truncated, malformed, or unsupported."""


class TokenizerError(EngineError):
    """A tokenizer cannot be built from a file's metadata, or an input cannot be tokenized."""


class TemplateError(EngineError):
    """A chat template cannot be parsed, or raised while rendering a conversation."""


class DatasetError(EngineError):
    """A dataset file cannot be read at all (single bad lines are reported as problems)."""


class ExportError(EngineError):
    """An adapter or model cannot be written."""


class ConfigError(EngineError, ValueError):
    """A setting is out of range or of the wrong kind (a TrainConfig field, a CLI option)."""
