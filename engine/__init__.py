"""Tune Studio engine: UI-free GGUF loading, tokenization, chat templates, forward pass and generation.

Runs on NumPy (CPU); imports nothing from Qt. The studio and the CLI use the names exported here.
"""

from .archs import ARCHS, ArchSpec, ModelConfig, supported_architectures
from .chat_template import CHATML_TEMPLATE, ChatTemplate
from .errors import DatasetError, EngineError, ExportError, ModelError, TemplateError, TokenizerError
from .generate import GREEDY, Generation, SamplingConfig, generate
from .gguf_file import GGUFFile, TensorInfo, dequantizable_types
from .lora import LoraAdapter
from .model import KVCache, Model
from .ops import LoraTerm
from .summary import ModelSummary, TensorKind, summarize
from .synth import SynthSpec, write_adapter, write_model
from .tokenizer import Tokenizer

__all__ = [
    "ARCHS",
    "ArchSpec",
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "DatasetError",
    "EngineError",
    "ExportError",
    "GGUFFile",
    "GREEDY",
    "Generation",
    "KVCache",
    "LoraAdapter",
    "LoraTerm",
    "Model",
    "ModelConfig",
    "ModelError",
    "ModelSummary",
    "SamplingConfig",
    "SynthSpec",
    "TemplateError",
    "TensorInfo",
    "TensorKind",
    "Tokenizer",
    "TokenizerError",
    "dequantizable_types",
    "generate",
    "summarize",
    "supported_architectures",
    "write_adapter",
    "write_model",
]
