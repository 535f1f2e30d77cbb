"""Tune Studio engine: UI-free GGUF loading, tokenization, chat templates, forward and backward passes,
training, generation, export.

Runs on NumPy (CPU); imports nothing from Qt. The studio and the CLI use the names exported here.
Each is loaded on first use (PEP 562): `import engine` costs the errors module alone, so a child
process that needs one corner of the engine (a file reader, a token counter, a rank) imports that
corner only. `_MODULES` says where each name is defined.
"""

import importlib as _importlib

from . import _blas_env  # noqa: F401 - first: OpenBLAS's spin, before anything loads NumPy
from .errors import (  # noqa: F401 - exported
    ConfigError,
    DatasetError,
    EngineError,
    ExportError,
    ModelError,
    TemplateError,
    TokenizerError,
)

# the names each module exports through this package (modules relative to it)
_MODULES = {
    ".backend": "Backend Device available_devices select_backend",
    ".export.check": (
        "BAD_MARK MERGE_TYPES MIN_EFFECT_KEPT OK_MARK CheckItem CheckpointEntry CheckReport "
        "ExportRequest check_export checkpoint_roots estimate_size export_modelfile find_checkpoints "
        "run_of suggest_out write_export"
    ),
    ".export.verify": (
        "TOLERANCE VERIFY_PROMPTS PromptResult VerifyReport failed_name quarantine verify_export"
    ),
    ".export.write": (
        "ADAPTER_TYPES MERGE_BASE_TYPE MergeReport adapter_tensor_types export_adapter export_merged "
        "export_size fit_problems merged_tensor_types"
    ),
    ".io.files": "AppendLog atomic_write check_outputs user_data_folder",
    ".io.gguf_file": "KNOWN_TYPES GGUFFile TensorInfo dequantizable_types",
    ".io.quantize": "quantizable_types",
    ".model.archs": "ARCHS ArchSpec ModelConfig supported_architectures",
    ".model.generate": "GREEDY Generation SamplingConfig generate",
    ".model.lora": "LoraAdapter lora_shapes",
    ".model.model": "KVCache Model",
    ".model.ops": "LoraTerm",
    ".model.summary": "LayerLayout ModelSummary TensorKind human_bytes human_count summarize",
    ".model.targets": (
        "PRESETS Candidate TargetSpec llamacpp_unadapted_kinds lora_candidates lora_param_count "
        "parse_layers select_full select_targets split_name"
    ),
    ".ranges": "RANGES Range check_number",
    ".session": "RUN EngineSession Reply template_for",
    ".testing": "SynthSpec write_adapter write_model",
    ".text.chat_template": "CHATML_TEMPLATE ChatTemplate",
    ".text.tokenizer": "Tokenizer",
    ".train.advice": "plan_warning",
    ".train.batches": "Batch count_windows",
    ".train.census": "Census CensusCancelled CensusProgress LeftOut left_out routing_census",
    ".train.commands": "local_ranks_available shell_line train_command",
    ".train.convert": "ColumnMap Conversion Source convert_file convert_source guess_map read_source",
    ".train.data": "Problem Sample append_jsonl iter_jsonl load_jsonl parse_sample sample_to_json save_jsonl",
    ".train.encode": "Encoded EncodeOptions encode_iter encode_samples",
    ".train.events": (
        "Checkpoint Eval ExpertUsage Failed Finished LoraNorms Paused Plan PreferenceEval "
        "PreferenceStep RunWarning SampleAnswers Started Step event_from_json event_to_json "
        "follow_events"
    ),
    ".train.memory": "MemoryEstimate estimate_memory",
    ".train.norms": "NormsReport lora_norms",
    ".train.pref_data": "BlindPair append_preference blind_pair chosen_text with_answers",
    ".train.ratings": "RewardError load_ratings parse_rating rating_from_stars",
    ".train.resume": (
        "SAMPLES_FILE TRAJECTORY_FIELDS CheckpointInfo describe_settings read_checkpoint_info "
        "trajectory_changes"
    ),
    ".train.reward_fns": "CheckError CheckSpec Score Scorer reference_of",
    ".train.reward_session": "Answer Preview RewardConfig RewardSession RoundResult ScoredGroup",
    ".train.rewards": "group_advantages reward_weights",
    ".train.rounds": (
        "AutoRounds Example PromptItem RoundProgress RoundReport RoundsConfig load_prompts "
        "prompt_from_json round_table"
    ),
    ".train.runs": "RunRecord find_runs latest_finished read_run run_from_events",
    ".train.trainer": "TrainConfig Trainer",
    ".train.val_split": "validation_indices",
}
# exported under another name: (module, its name there)
_RENAMED = {
    "PREFERENCE_CHOICES": (".train.pref_data", "CHOICES"),
    "BUILTIN_CHECKS": (".train.reward_fns", "BUILTINS"),
}
_WHERE = {name: (module, name) for module, names in _MODULES.items() for name in names.split()} | _RENAMED
__all__ = sorted(
    [
        *_WHERE,
        "ConfigError",
        "DatasetError",
        "EngineError",
        "ExportError",
        "ModelError",
        "TemplateError",
        "TokenizerError",
    ]
)


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value  # the next use is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
