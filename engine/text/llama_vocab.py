"""llama.cpp's vocabulary rules as data, for engine.text.tokenizer.

Token types and attribute bits (llama_token_type, llama_token_attr), the metadata keys of the special
token ids and the texts llama.cpp detects special and end-of-generation tokens by
(`llama_vocab::impl::load`), the pre-tokenizer regular expressions by `tokenizer.ggml.pre`
(`llm_tokenizer_bpe`), and the byte-level BPE alphabet. No logic beyond building these tables.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

# -- llama.cpp constants ------------------------------------------------------

# tokenizer.ggml.token_type values (llama_token_type)
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# llama_token_attr bits (a token's attributes after llama.cpp's load-time fix-ups)
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_RSTRIP = 1 << 8

ATTR_OF_TYPE = types.MappingProxyType(
    {
        TOKEN_TYPE_NORMAL: ATTR_NORMAL,
        TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
        TOKEN_TYPE_CONTROL: ATTR_CONTROL,
        TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
        TOKEN_TYPE_UNUSED: ATTR_UNUSED,
        TOKEN_TYPE_BYTE: ATTR_BYTE,
    }
)
ATTR_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL  # hidden unless asked for, split only with parse_special

MODELS = types.MappingProxyType({"llama": "spm", "gpt2": "bpe"})

SPACE_MARK = "\u2581"  # "▁", SentencePiece's escaped space

# Special ids that must lie inside the vocabulary (a TokenizerError otherwise): encode and
# generation use them. Others out of range are ignored with a warning, as llama.cpp does.
REQUIRED_IN_VOCAB = frozenset({"bos", "eos", "eot", "eom", "unk"})
MAX_MERGED_PIECE = 1024  # SentencePiece pieces longer than this get no merges (see _spm_merges)

# Metadata keys of the special token ids, by llama.cpp's name (later keys are deprecated spellings)
ID_KEYS = types.MappingProxyType(
    {
        "bos": ("tokenizer.ggml.bos_token_id",),
        "eos": ("tokenizer.ggml.eos_token_id",),
        "eot": ("tokenizer.ggml.eot_token_id",),
        "eom": ("tokenizer.ggml.eom_token_id",),
        "unk": ("tokenizer.ggml.unknown_token_id",),
        "sep": ("tokenizer.ggml.seperator_token_id",),
        "pad": ("tokenizer.ggml.padding_token_id",),
        "mask": ("tokenizer.ggml.mask_token_id",),
        "fim_pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
        "fim_suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
        "fim_mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
        "fim_pad": ("tokenizer.ggml.fim_pad_token_id",),
        "fim_rep": ("tokenizer.ggml.fim_rep_token_id",),
        "fim_sep": ("tokenizer.ggml.fim_sep_token_id",),
    }
)

# Texts that llama.cpp recognises as special tokens when the metadata does not name them
# (llama_vocab::impl::load, "auto-detect special tokens by text"). Each detection also
# marks the token CONTROL.
EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)  # fmt: skip
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = types.MappingProxyType({
    "fim_pre": (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
        "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
        "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
        "\u2581<MID>", "<|code_middle|>", "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
})  # fmt: skip
# Token texts that end generation (the special_eog_ids loop).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})  # fmt: skip
# gpt-oss: always rendered, so llama.cpp forces them USER_DEFINED.
FORCED_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


# -- pre-tokenizer regexes, verbatim from llama.cpp's llm_tokenizer_bpe ---------------
# Each entry is applied in order to the pieces the previous one produced (llama.cpp's
# unicode_regex_split; a Sequence of isolated Splits in `tokenizers`).

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PUNCT_WORDS = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
# cased letters (\p{LC}) as deepseek-llm's tokenizer.json spells them out
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_UPPER_LOWER = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
)

_GPT2_BUILTIN = None  # marker: the gpt-2 regex built into the ByteLevel pre-tokenizer (use_regex=True)

REGEXES: Mapping[str, tuple[str, ...] | None] = types.MappingProxyType({
    "DEFAULT": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "GPT2": _GPT2_BUILTIN,
    "LLAMA3": (_LLAMA3,),
    "JAIS2": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
        r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    ),
    "DEEPSEEK_LLM": (
        "[\r\n]",
        _DEEPSEEK_LETTERS,
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "DEEPSEEK3_LLM": (
        r"\p{N}{1,3}",
        _CJK_KANA,
        _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "SPARK2_5": (
        r"\p{N}{1,3}",
        _CJK_KANA,
        _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    ),
    "DEEPSEEK_CODER": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "FALCON": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "STARCODER": (r"\p{N}", _GPT2),
    "QWEN2": (_QWEN2,),
    "QWEN35": (
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "PORO": (_PORO,),
    "VIKING": (_PORO, r"\p{N}"),
    "TEKKEN": (_UPPER_LOWER + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "CHAMELEON": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        _GPT2,
    ),
    "GPT4O": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "BAILINGMOE": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "SEED_CODER": (
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "UFAKZEKA": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "LAGUNA": (r"[^\n]+|[\n]+", _QWEN2),
    "EXAONE_MOE": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "MINICPM5": (
        r"\p{N}{1,3}",
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
})  # fmt: skip


@dataclass(frozen=True)
class PreSpec:
    """What a `tokenizer.ggml.pre` name selects in llama.cpp."""

    regexes: str  # key into REGEXES (llama.cpp's LLAMA_VOCAB_PRE_TYPE_*)
    ignore_merges: bool = False  # a whole pre-token found in the vocabulary is taken as is
    add_bos: bool = False  # default of tokenizer.ggml.add_bos_token
    no_default_bos: bool = False  # llama.cpp clears the default BOS id (chatglm)


def _pre_table() -> Mapping[str, PreSpec]:
    llama3 = PreSpec("LLAMA3", ignore_merges=True, add_bos=True)
    groups: list[tuple[PreSpec, tuple[str, ...]]] = [
        (PreSpec("DEFAULT"), ("default",)),
        (llama3, ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")),
        (PreSpec("LLAMA3"), ("dbrx", "smaug-bpe")),
        (PreSpec("JAIS2"), ("jais-2",)),
        (PreSpec("DEEPSEEK_LLM"), ("deepseek-llm",)),
        (PreSpec("DEEPSEEK_CODER"), ("deepseek-coder",)),
        (PreSpec("DEEPSEEK3_LLM"), ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4")),
        (PreSpec("SPARK2_5"), ("spark2_5",)),
        (PreSpec("FALCON"), ("falcon",)),
        (
            PreSpec("GPT2"),
            ("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais", "trillion",
             "granite-docling"),
        ),
        (
            PreSpec("STARCODER"),
            ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
        ),
        (
            PreSpec("QWEN2"),
            ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
             "grok-2"),
        ),
        (PreSpec("QWEN35"), ("qwen35",)),
        (PreSpec("PORO"), ("poro-chat", "bloom", "gpt3-finnish")),
        (PreSpec("LLAMA3", no_default_bos=True), ("glm4", "chatglm-bpe")),
        (PreSpec("VIKING"), ("viking",)),
        (PreSpec("TEKKEN", ignore_merges=True, add_bos=True), ("tekken",)),
        (PreSpec("CHAMELEON", add_bos=True), ("chameleon",)),
        (PreSpec("GPT4O"), ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")),
        (PreSpec("BAILINGMOE"), ("bailingmoe", "bailingmoe2", "llada-moe")),
        (PreSpec("SEED_CODER"), ("seed-coder",)),
        (PreSpec("UFAKZEKA"), ("ufakzeka",)),
        (PreSpec("LAGUNA"), ("laguna",)),
        (PreSpec("EXAONE_MOE"), ("exaone-moe",)),
        (PreSpec("MINICPM5", ignore_merges=True), ("minicpm5",)),
    ]  # fmt: skip
    return types.MappingProxyType({name: spec for spec, names in groups for name in names})


# tokenizer.ggml.pre names that llama.cpp supports and this module builds
PRE_TOKENIZERS: Mapping[str, PreSpec] = _pre_table()


def _byte_level_tables() -> tuple[Mapping[int, str], Mapping[int, int]]:
    """GPT-2's byte <-> printable character map, and its inverse as a str.translate table."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_to_char = {b: chr(c) for b, c in zip(bs, cs, strict=True)}
    char_to_byte = {c: b for b, c in zip(bs, cs, strict=True)}
    return types.MappingProxyType(byte_to_char), types.MappingProxyType(char_to_byte)


BYTE_TO_CHAR, CHAR_TO_BYTE = _byte_level_tables()
