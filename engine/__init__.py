"""Tune Studio engine: UI-free GGUF loading, tokenization, chat templates, forward and backward passes,
training, generation, export.

Runs on NumPy (CPU); imports nothing from Qt. The studio and the CLI use the names exported here.
"""

from . import _blas_env  # noqa: F401 - first: OpenBLAS's spin, before anything loads NumPy
from .backend import Backend, Device, available_devices, select_backend
from .errors import (
    ConfigError,
    DatasetError,
    EngineError,
    ExportError,
    ModelError,
    TemplateError,
    TokenizerError,
)
from .export.check import (
    BAD_MARK,
    MERGE_TYPES,
    MIN_EFFECT_KEPT,
    OK_MARK,
    CheckItem,
    CheckpointEntry,
    CheckReport,
    ExportRequest,
    check_export,
    checkpoint_roots,
    estimate_size,
    export_modelfile,
    find_checkpoints,
    run_of,
    suggest_out,
    write_export,
)
from .export.verify import (
    TOLERANCE,
    VERIFY_PROMPTS,
    PromptResult,
    VerifyReport,
    failed_name,
    quarantine,
    verify_export,
)
from .export.write import (
    ADAPTER_TYPES,
    MERGE_BASE_TYPE,
    MergeReport,
    adapter_tensor_types,
    export_adapter,
    export_merged,
    export_size,
    fit_problems,
    merged_tensor_types,
)
from .io.files import AppendLog, atomic_write, check_outputs, user_data_folder
from .io.gguf_file import KNOWN_TYPES, GGUFFile, TensorInfo, dequantizable_types
from .io.quantize import quantizable_types
from .model.archs import ARCHS, ArchSpec, ModelConfig, supported_architectures
from .model.generate import GREEDY, Generation, SamplingConfig, generate
from .model.lora import LoraAdapter, lora_shapes
from .model.model import KVCache, Model
from .model.ops import LoraTerm
from .model.summary import LayerLayout, ModelSummary, TensorKind, human_bytes, human_count, summarize
from .model.targets import (
    PRESETS,
    Candidate,
    TargetSpec,
    llamacpp_unadapted_kinds,
    lora_candidates,
    lora_param_count,
    parse_layers,
    select_full,
    select_targets,
    split_name,
)
from .ranges import RANGES, Range, check_number
from .session import RUN, EngineSession, Reply, template_for
from .testing import SynthSpec, write_adapter, write_model
from .text.chat_template import CHATML_TEMPLATE, ChatTemplate
from .text.tokenizer import Tokenizer
from .train.advice import plan_warning
from .train.batches import Batch, count_windows
from .train.census import Census, CensusCancelled, CensusProgress, LeftOut, left_out, routing_census
from .train.commands import local_ranks_available, shell_line, train_command
from .train.convert import ColumnMap, Conversion, Source, convert_file, convert_source, guess_map, read_source
from .train.data import (
    Problem,
    Sample,
    append_jsonl,
    iter_jsonl,
    load_jsonl,
    parse_sample,
    sample_to_json,
    save_jsonl,
)
from .train.encode import Encoded, EncodeOptions, encode_iter, encode_samples
from .train.events import (
    Checkpoint,
    Eval,
    ExpertUsage,
    Failed,
    Finished,
    LoraNorms,
    Paused,
    Plan,
    PreferenceEval,
    PreferenceStep,
    RunWarning,
    SampleAnswers,
    Started,
    Step,
    event_from_json,
    event_to_json,
    follow_events,
)
from .train.memory import MemoryEstimate, estimate_memory
from .train.norms import NormsReport, lora_norms
from .train.pref_data import CHOICES as PREFERENCE_CHOICES
from .train.pref_data import BlindPair, append_preference, blind_pair, chosen_text, with_answers
from .train.ratings import RewardError, load_ratings, parse_rating, rating_from_stars
from .train.resume import (
    SAMPLES_FILE,
    TRAJECTORY_FIELDS,
    CheckpointInfo,
    describe_settings,
    read_checkpoint_info,
    trajectory_changes,
)
from .train.reward_fns import BUILTINS as BUILTIN_CHECKS
from .train.reward_fns import CheckError, CheckSpec, Score, Scorer, reference_of
from .train.reward_session import Answer, Preview, RewardConfig, RewardSession, RoundResult, ScoredGroup
from .train.rewards import group_advantages, reward_weights
from .train.rounds import (
    AutoRounds,
    Example,
    PromptItem,
    RoundProgress,
    RoundReport,
    RoundsConfig,
    load_prompts,
    prompt_from_json,
    round_table,
)
from .train.runs import RunRecord, find_runs, latest_finished, read_run, run_from_events
from .train.trainer import TrainConfig, Trainer
from .train.val_split import validation_indices

__all__ = [
    "adapter_tensor_types", "ADAPTER_TYPES", "Answer", "append_jsonl", "append_preference", "AppendLog",
    "ARCHS", "ArchSpec", "atomic_write", "AutoRounds", "available_devices", "Backend", "BAD_MARK", "Batch",
    "blind_pair", "BlindPair", "BUILTIN_CHECKS", "Candidate", "CHATML_TEMPLATE", "ChatTemplate",
    "check_export", "check_number", "check_outputs", "CheckError", "CheckItem", "Checkpoint",
    "checkpoint_roots", "CheckpointEntry", "CheckpointInfo", "CheckReport", "CheckSpec", "chosen_text",
    "ColumnMap", "ConfigError", "Conversion", "convert_file", "convert_source", "DatasetError",
    "dequantizable_types", "describe_settings", "Device", "encode_iter", "encode_samples", "Encoded",
    "Census", "CensusCancelled", "CensusProgress", "LeftOut", "left_out", "routing_census",
    "EncodeOptions", "EngineError", "EngineSession", "estimate_memory", "estimate_size", "Eval",
    "event_from_json", "event_to_json", "Example", "ExpertUsage", "export_adapter", "export_merged",
    "export_modelfile", "export_size", "ExportError", "ExportRequest", "Failed", "failed_name",
    "count_windows", "find_checkpoints", "find_runs", "read_run", "Finished", "fit_problems", "follow_events",
    "generate", "Generation",
    "GGUFFile", "GREEDY", "group_advantages", "guess_map", "human_bytes", "human_count", "iter_jsonl",
    "KNOWN_TYPES", "KVCache", "latest_finished", "LayerLayout", "llamacpp_unadapted_kinds", "load_jsonl",
    "load_prompts", "load_ratings", "local_ranks_available", "lora_candidates", "lora_norms",
    "lora_param_count", "lora_shapes", "LoraAdapter", "LoraNorms", "LoraTerm", "MemoryEstimate",
    "MERGE_BASE_TYPE", "MERGE_TYPES", "merged_tensor_types", "MergeReport", "MIN_EFFECT_KEPT", "Model",
    "ModelConfig", "ModelError", "ModelSummary", "NormsReport", "OK_MARK", "parse_layers", "parse_rating",
    "parse_sample", "Paused", "Plan", "plan_warning", "PREFERENCE_CHOICES", "PreferenceEval",
    "PreferenceStep", "PRESETS", "Preview", "Problem", "prompt_from_json", "PromptItem", "PromptResult",
    "quantizable_types", "quarantine", "Range", "RANGES", "rating_from_stars", "read_checkpoint_info",
    "read_source", "reference_of", "Reply", "reward_weights", "RewardConfig", "RewardError",
    "RewardSession", "round_table", "RoundProgress", "RoundReport", "RoundResult", "RoundsConfig", "RUN",
    "run_from_events", "run_of", "RunRecord", "RunWarning", "Sample", "sample_to_json", "SampleAnswers",
    "SAMPLES_FILE", "SamplingConfig", "save_jsonl", "Score", "ScoredGroup", "Scorer", "select_backend",
    "select_full", "select_targets", "shell_line", "Source", "split_name", "Started", "Step", "suggest_out",
    "summarize", "supported_architectures", "SynthSpec", "TargetSpec", "template_for", "TemplateError",
    "TensorInfo", "TensorKind", "Tokenizer", "TokenizerError", "TOLERANCE", "train_command", "TrainConfig",
    "Trainer", "trajectory_changes", "TRAJECTORY_FIELDS", "user_data_folder", "validation_indices",
    "verify_export", "VERIFY_PROMPTS", "VerifyReport", "with_answers", "write_adapter", "write_export",
    "write_model"
]  # fmt: skip
