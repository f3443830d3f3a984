"""The pre-tokenizer of every ``tokenizer.ggml.pre`` value llama.cpp knows, as data.

llama.cpp (src/llama-vocab.cpp, ``llama_vocab::impl::load``) maps each ``pre`` name onto a
``LLAMA_VOCAB_PRE_TYPE_*`` plus a few tokenizer flags, and ``llm_tokenizer_bpe`` gives each type a
list of regexes. The regexes are applied in order: each one splits every piece the previous ones
left into its matches and the text between them (the ``tokenizers`` library's ``Split`` with
"isolated" behaviour does exactly that).

llama.cpp does not run these regexes in a Unicode regex engine: a few have hand-written splitters
(unicode.cpp) and the rest go through std::regex over text in which every non-ASCII code point is
collapsed to one byte per Unicode category. The strings below are llama.cpp's, rewritten only where
its engine means something else than Oniguruma (the engine behind ``tokenizers.Regex``) would:

- ``\\p{Lu}``, ``\\p{Ll}``, ``\\p{Lt}``, ``\\p{Lm}``, ``\\p{Lo}`` all collapse to "letter" in llama.cpp,
  so they are written ``\\p{L}`` here (upper/lower case is *not* told apart for those types);
- ECMAScript ``$`` is the end of the input, Oniguruma's is the end of a line: written ``\\z``;
- std::wregex ``\\d`` is ASCII-only: written ``[0-9]``;
- the two splitters that are code, not regexes (``\\p{AFMoE_digits}`` and Kimi-K2's ``\\p{Han}+``), are
  written as the regexes that split the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggflow.errors import ModelLoadError

# --- building blocks shared by many types ---------------------------------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_ASCII_PUNCT_THEN_WORD = r"[!" '"' r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"

# llama.cpp's adaptation of the tiktoken-style case-aware word regex: "a run of letters that are not
# a-z, then letters that are not A-Z" (non-ASCII letters count as both cases).
_UPPER_RUN = r"((?=[\p{L}])([^a-z]))"
_LOWER_RUN = r"((?=[\p{L}])([^A-Z]))"
_WORD_BY_CASE = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_RUN + "*" + _LOWER_RUN + "+"
                 + r"|[^\r\n\p{L}\p{N}]?" + _UPPER_RUN + "+" + _LOWER_RUN + "*")

# [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}] after llama.cpp's category collapse.
_LETTER_OR_MARK = r"[\p{L}\p{M}]"

# unicode.cpp's custom AFMoE digit splitter: a digit run is cut into a leading group of
# len % 3 digits (if any) and groups of three, and the text *before* a run is glued to its
# first group. Matches may only start at the beginning of a piece or right after a digit,
# which keeps the regex linear.
_AFMOE_DIGITS = r"(?:\A|(?<=\p{N}))\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"

# unicode_cpt_is_han's ranges, for Kimi-K2's custom splitter.
_HAN = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
        "\U0002b820-\U0002ceaf\U0002ceb0-\U0002ebef\uf900-\ufaff\U0002f800-\U0002fa1f")
_KIMI_K2 = ("[" + _HAN + "]+"
            r"|[^\r\n\p{L}\p{N}]?[\p{L}&&[^" + _HAN + "]]+"
            "(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# --- LLAMA_VOCAB_PRE_TYPE_* -> regexes (llm_tokenizer_bpe's constructor) ----------------------

PRE_TYPE_REGEXES: dict[str, tuple[str, ...]] = {
    "DEFAULT": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "LLAMA3": (LLAMA3,),
    "DBRX": (LLAMA3,),
    "SMAUG": (LLAMA3,),
    "CHATGLM4": (LLAMA3,),
    "JAIS2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
              r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "DEEPSEEK_LLM": (
        "[\r\n]",
        "\\s?"
        "[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-"
        "\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-"
        "\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-"
        "\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc"
        "\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-"
        "\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-"
        "\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-"
        "\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-"
        "\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
        "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
        "\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\z",
        _DEEPSEEK_CJK,
        r"\p{N}+",
    ),
    "DEEPSEEK3_LLM": (
        r"\p{N}{1,3}",
        _CJK_KANA,
        _ASCII_PUNCT_THEN_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "SPARK2_5": (
        r"\p{N}{1,3}",
        _CJK_KANA,
        _ASCII_PUNCT_THEN_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]"
        r"|\s+(?!\S)|\s+",
        r"\p{N}",
    ),
    "YOUTU": (
        "[\uac00-\ud7a3\u3131-\u318e]+"
        "|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+"
        "|[\u3105-\u312f]+|" + _CJK_KANA,
        r"[^\r\n\p{L}\p{N}]?" + _LETTER_OR_MARK + "*" + _LETTER_OR_MARK + "+" + _CONTRACTIONS + "?"
        + r"|[^\r\n\p{L}\p{N}]?" + _LETTER_OR_MARK + "+" + _LETTER_OR_MARK + "*" + _CONTRACTIONS + "?"
        + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "DEEPSEEK_CODER": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}"),
    "FALCON": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "STARCODER": (r"\p{N}", GPT2),
    "GPT2": (GPT2,),
    "QWEN2": (QWEN2,),
    "QWEN35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "PORO": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "VIKING": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
    "TEKKEN": (_WORD_BY_CASE + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "CHAMELEON": (
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2,
    ),
    "GPT4O": (r"[^\r\n\p{L}\p{N}]?" + _UPPER_RUN + "*" + _LOWER_RUN + "+" + _CONTRACTIONS + "?"
              + r"|[^\r\n\p{L}\p{N}]?" + _UPPER_RUN + "+" + _LOWER_RUN + "*" + _CONTRACTIONS + "?"
              + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "GRANITE_EMB_MULTI": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS + "?"
        + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS + "?"
        + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "TINY_AYA": (
        _AFMOE_DIGITS,
        r"[^\r\n\p{L}\p{N}]?" + _LETTER_OR_MARK + "*" + _LETTER_OR_MARK + "+" + _CONTRACTIONS + "?"
        + r"|[^\r\n\p{L}\p{N}]?" + _LETTER_OR_MARK + "+" + _LETTER_OR_MARK + "*" + _CONTRACTIONS + "?"
        + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "KIMI_K2": (_KIMI_K2,),
    "SUPERBPE": (r"\p{N}+", r"(?=([0-9]{3})+(?![0-9]))"),
    "BAILINGMOE": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "SEED_CODER": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "UFAKZEKA": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "GROK_2": (QWEN2,),
    "AFMOE": (
        _AFMOE_DIGITS,
        # (sic: U+8C48, not U+F900, is what llama-vocab.cpp has)
        "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
        "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
        "\u1100-\u11ff]+",
        _ASCII_PUNCT_THEN_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "LAGUNA": (r"[^\n]+|[\n]+", QWEN2),
    "EXAONE_MOE": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "MINICPM5": (r"\p{N}{1,3}",
                 _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
# Types that share another type's regexes in llm_tokenizer_bpe's switch.
for _alias, _same_as in {
        "REFACT": "STARCODER", "COMMAND_R": "STARCODER", "SMOLLM": "STARCODER", "CODESHELL": "STARCODER",
        "EXAONE": "STARCODER", "MINERVA": "STARCODER", "MELLUM2": "STARCODER",
        "MPT": "GPT2", "OLMO": "GPT2", "JAIS": "GPT2", "TRILLION": "GPT2", "GRANITE_DOCLING": "GPT2",
        "STABLELM2": "QWEN2", "HUNYUAN": "QWEN2", "SOLAR_OPEN": "QWEN2",
        "BLOOM": "PORO", "GPT3_FINNISH": "PORO",
        "HUNYUAN_DENSE": "DEEPSEEK3_LLM", "JOYAI_LLM": "DEEPSEEK3_LLM", "HY_V4": "DEEPSEEK3_LLM",
        "MINIMAX_M2": "GPT4O"}.items():
    PRE_TYPE_REGEXES[_alias] = PRE_TYPE_REGEXES[_same_as]

# Types whose llama.cpp tokenizer is SentencePiece-style BPE on raw UTF-8 (byte_encode = false):
# not byte-level, so not built here.
UNSUPPORTED_PRE_TYPES = {"GEMMA4", "SARVAM_MOE", "WHITESPACE"}


@dataclass(frozen=True)
class PreTokenizerSettings:
    """What one ``tokenizer.ggml.pre`` value sets in llama_vocab::impl::load (BPE vocabularies)."""
    pre_type: str                 # LLAMA_VOCAB_PRE_TYPE_<pre_type>
    clean_spaces: bool = True     # detokenize's clean_up_tokenization_spaces passes
    ignore_merges: bool = False   # a pre-token that is a whole vocab entry skips the merges
    add_bos: bool = False         # default of add_bos before tokenizer.ggml.add_bos_token overrides it
    no_bos: bool = False          # special_bos_id = LLAMA_TOKEN_NULL before the metadata overrides it

    @property
    def regexes(self) -> tuple[str, ...]:
        return PRE_TYPE_REGEXES[self.pre_type]


def _names(names: str, **settings) -> dict[str, PreTokenizerSettings]:
    return {name: PreTokenizerSettings(**settings) for name in names.split()}


_KEEP = dict(clean_spaces=False)

# tokenizer.ggml.pre -> settings, as the if/else chain in llama_vocab::impl::load.
PRE_NAMES: dict[str, PreTokenizerSettings] = {
    **_names("default", pre_type="DEFAULT"),
    **_names("minicpm5", pre_type="MINICPM5", ignore_merges=True),
    **_names("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
             pre_type="LLAMA3", ignore_merges=True, add_bos=True),
    **_names("deepseek-llm", pre_type="DEEPSEEK_LLM", **_KEEP),
    **_names("deepseek-coder", pre_type="DEEPSEEK_CODER", **_KEEP),
    **_names("deepseek-v3", pre_type="DEEPSEEK3_LLM", **_KEEP),
    **_names("spark2_5", pre_type="SPARK2_5", **_KEEP),
    **_names("youtu", pre_type="YOUTU", ignore_merges=True, **_KEEP),
    **_names("falcon", pre_type="FALCON"),
    **_names("mpt", pre_type="MPT"),
    **_names("starcoder", pre_type="STARCODER"),
    **_names("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
             "jina-v1-en jina-v2-code roberta-bpe exaone4", pre_type="GPT2"),
    **_names("jais-2", pre_type="JAIS2"),
    **_names("gemma4 granite-embed-multi-311m", pre_type="GEMMA4"),
    **_names("sarvam-moe", pre_type="SARVAM_MOE", **_KEEP),
    **_names("whitespace", pre_type="WHITESPACE"),
    **_names("refact", pre_type="REFACT"),
    **_names("command-r", pre_type="COMMAND_R", **_KEEP),
    **_names("qwen2 deepseek-r1-qwen kormo f2llmv2", pre_type="QWEN2", **_KEEP),
    **_names("megrez", pre_type="QWEN2"),
    **_names("qwen35", pre_type="QWEN35", **_KEEP),
    **_names("stablelm2", pre_type="STABLELM2"),
    **_names("olmo", pre_type="OLMO"),
    **_names("dbrx", pre_type="DBRX"),
    **_names("smaug-bpe", pre_type="SMAUG"),
    **_names("poro-chat", pre_type="PORO", **_KEEP),
    **_names("chatglm-bpe", pre_type="CHATGLM4", no_bos=True),
    **_names("glm4 glm5", pre_type="CHATGLM4", no_bos=True, ignore_merges=True),
    **_names("viking", pre_type="VIKING", **_KEEP),
    **_names("jais", pre_type="JAIS"),
    **_names("tekken", pre_type="TEKKEN", ignore_merges=True, add_bos=True, **_KEEP),
    **_names("smollm", pre_type="SMOLLM", **_KEEP),
    **_names("codeshell", pre_type="CODESHELL"),
    **_names("bloom", pre_type="BLOOM"),
    **_names("gpt3-finnish", pre_type="GPT3_FINNISH"),
    **_names("exaone", pre_type="EXAONE"),
    **_names("exaone-moe", pre_type="EXAONE_MOE"),
    **_names("chameleon", pre_type="CHAMELEON", add_bos=True, **_KEEP),
    **_names("minerva-7b", pre_type="MINERVA"),
    **_names("gpt-4o llama4 kanana2 talkie", pre_type="GPT4O", **_KEEP),
    **_names("granite-embed-multi-97m", pre_type="GRANITE_EMB_MULTI", ignore_merges=True, **_KEEP),
    **_names("tiny_aya cohere2moe", pre_type="TINY_AYA", **_KEEP),
    **_names("superbpe", pre_type="SUPERBPE", **_KEEP),
    **_names("trillion", pre_type="TRILLION", **_KEEP),
    **_names("granite-docling", pre_type="GRANITE_DOCLING", **_KEEP),
    **_names("bailingmoe bailingmoe2 llada-moe", pre_type="BAILINGMOE", **_KEEP),
    **_names("seed-coder", pre_type="SEED_CODER", **_KEEP),
    **_names("hunyuan", pre_type="HUNYUAN", **_KEEP),
    **_names("hunyuan-dense", pre_type="HUNYUAN_DENSE", **_KEEP),
    **_names("hy_v4", pre_type="HY_V4", **_KEEP),
    **_names("joyai-llm", pre_type="JOYAI_LLM", **_KEEP),
    **_names("kimi-k2", pre_type="KIMI_K2", **_KEEP),
    **_names("ufakzeka", pre_type="UFAKZEKA", **_KEEP),
    **_names("grok-2", pre_type="GROK_2", **_KEEP),
    **_names("afmoe", pre_type="AFMOE", **_KEEP),
    **_names("laguna", pre_type="LAGUNA", **_KEEP),
    **_names("minimax-m2", pre_type="MINIMAX_M2", **_KEEP),
    **_names("solar-open", pre_type="SOLAR_OPEN", **_KEEP),
    **_names("mellum2", pre_type="MELLUM2"),
}


def supported_pre_names() -> list[str]:
    return sorted(n for n, s in PRE_NAMES.items() if s.pre_type not in UNSUPPORTED_PRE_TYPES)


def pre_tokenizer_settings(pre: str | None, source: str = "") -> PreTokenizerSettings:
    """Settings for a ``tokenizer.ggml.pre`` value; a missing value is llama.cpp's "default"."""
    where = f"{source}: " if source else ""
    settings = PRE_NAMES.get(pre or "default")
    if settings is None:
        raise ModelLoadError(f"{where}unknown pre-tokenizer tokenizer.ggml.pre = {pre!r}; "
                             f"known: {', '.join(supported_pre_names())}")
    if settings.pre_type in UNSUPPORTED_PRE_TYPES:
        raise ModelLoadError(f"{where}pre-tokenizer {pre!r} (llama.cpp's {settings.pre_type}) is "
                             "SentencePiece-style BPE on raw UTF-8, which ggflow does not build; "
                             f"byte-level pre-tokenizers: {', '.join(supported_pre_names())}")
    return settings
