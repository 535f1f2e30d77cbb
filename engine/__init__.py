"""Tune Studio engine: UI-free GGUF loading, tokenization, chat templates, forward and backward passes,
training, generation, export.

Runs on NumPy (CPU); imports nothing from Qt. The studio and the CLI use the names exported here.
"""

from .archs import ARCHS, ArchSpec, ModelConfig, supported_architectures
from .chat_template import CHATML_TEMPLATE, ChatTemplate
from .data import Batch, EncodeOptions, Problem, Sample, load_jsonl, save_jsonl
from .errors import DatasetError, EngineError, ExportError, ModelError, TemplateError, TokenizerError
from .events import (
    Checkpoint,
    Eval,
    ExpertUsage,
    Failed,
    Finished,
    LoraNorms,
    Plan,
    Started,
    Step,
    event_to_json,
)
from .export import MergeReport, export_adapter, export_merged
from .generate import GREEDY, Generation, SamplingConfig, generate
from .gguf_file import GGUFFile, TensorInfo, dequantizable_types
from .lora import LoraAdapter
from .model import KVCache, Model
from .norms import NormsReport, lora_norms
from .ops import LoraTerm
from .summary import ModelSummary, TensorKind, summarize
from .synth import SynthSpec, write_adapter, write_model
from .targets import PRESETS, Candidate, TargetSpec, lora_candidates, select_targets
from .tokenizer import Tokenizer
from .trainer import TrainConfig, Trainer

__all__ = [
    "ARCHS", "ArchSpec", "Batch", "CHATML_TEMPLATE", "Candidate", "ChatTemplate", "Checkpoint",
    "DatasetError", "EncodeOptions", "EngineError", "Eval", "ExpertUsage", "ExportError", "Failed",
    "Finished", "GGUFFile", "GREEDY", "Generation", "KVCache", "LoraAdapter", "LoraNorms", "LoraTerm",
    "MergeReport", "Model", "ModelConfig", "ModelError", "ModelSummary", "NormsReport", "PRESETS",
    "Plan", "Problem", "Sample", "SamplingConfig", "Started", "Step", "SynthSpec", "TargetSpec",
    "TemplateError", "TensorInfo", "TensorKind", "Tokenizer", "TokenizerError", "TrainConfig", "Trainer",
    "dequantizable_types", "event_to_json", "export_adapter", "export_merged", "generate", "load_jsonl",
    "lora_candidates", "lora_norms", "save_jsonl", "select_targets", "summarize",
    "supported_architectures", "write_adapter", "write_model",
]  # fmt: skip
