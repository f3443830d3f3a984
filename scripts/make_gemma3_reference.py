"""Make the llama.cpp reference for tests/test_gemma3.py: gemma-3-270m (Q4_K_M), teacher-forced logits.

Runs llama.cpp through llama-cpp-python's low-level API (a llama_cpp package with the built libllama.so;
nothing of llama.cpp is vendored here), with an F16 KV cache, no flash attention and 2 threads, as the
other references under shared/models were made:

  1. tokenize a prompt longer than gemma3's 512-token sliding window (PROMPT_TOKENS tokens of the text);
  2. "alone": decode the prompt in one batch, then N_STEPS tokens one decode each (greedy: each step's
     token is the argmax of the previous logits), keeping the logits before each step;
  3. "batch": in a fresh context, decode prompt + those tokens in one batch with logits for every token.

Both runs see the same tokens at the same positions, so their difference is llama.cpp's own difference
between evaluating a token alone and in a batch: the test's tolerance. Saved (float32 / int32, small):
  gemma3-270m.llamacpp.npz: tokens [n_prompt + N_STEPS], top_ids [N_STEPS, TOP_K] (alone's top-k at each
  step), alone [N_STEPS, TOP_K] and batch [N_STEPS, TOP_K] (both runs' logits at those ids), n_prompt.

usage: python scripts/make_gemma3_reference.py MODEL.gguf OUT_DIR [TEXT_FILE]
(TEXT_FILE defaults to docs/architecture.md; the published reference was made from its version at commit
53a94e4. The token ids are saved, so the test does not need the text.)
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

import llama_cpp.llama_cpp as L

PROMPT_TOKENS = 600   # > gemma3's sliding window (512): local layers must drop the oldest tokens
N_STEPS = 32
TOP_K = 64
N_THREADS = 2


def make_context(model, n_ctx: int):
    params = L.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_ctx
    params.n_ubatch = n_ctx
    params.n_threads = params.n_threads_batch = N_THREADS
    params.type_k = params.type_v = 1          # GGML_TYPE_F16
    params.flash_attn_type = 0                 # LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.no_perf = True
    ctx = L.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit("llama_init_from_model failed")
    return ctx


def decode(ctx, tokens: list[int], pos0: int, n_vocab: int) -> np.ndarray:
    """Decode tokens at positions pos0.. with logits for every one -> float32 [len(tokens), n_vocab]."""
    n = len(tokens)
    batch = L.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        out = np.empty((n, n_vocab), dtype=np.float32)
        for i in range(n):
            ptr = L.llama_get_logits_ith(ctx, i)
            out[i] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        return out
    finally:
        L.llama_batch_free(batch)


def tokenize(vocab, text: str) -> list[int]:
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 16))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    if n < 0:
        raise SystemExit("llama_tokenize failed")
    return list(buf[:n])


def main(model_path: str, out_dir: str, text_file: str | None = None) -> None:
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mparams)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    text = Path(text_file or Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    prompt = tokenize(vocab, text)[:PROMPT_TOKENS]
    if len(prompt) < PROMPT_TOKENS:
        raise SystemExit(f"the text gives only {len(prompt)} tokens; need {PROMPT_TOKENS}")
    n_ctx = PROMPT_TOKENS + N_STEPS + 64

    ctx = make_context(model, n_ctx)
    last = decode(ctx, prompt, 0, n_vocab)[-1]
    tokens, alone = list(prompt), []
    for _ in range(N_STEPS):
        alone.append(last)
        tokens.append(int(np.argmax(last)))
        last = decode(ctx, tokens[-1:], len(tokens) - 1, n_vocab)[0]
    alone = np.array(alone)
    L.llama_free(ctx)

    ctx = make_context(model, n_ctx)
    batch = decode(ctx, tokens, 0, n_vocab)[len(prompt) - 1: len(prompt) - 1 + N_STEPS]
    L.llama_free(ctx)

    top_ids = np.argsort(-alone, axis=1)[:, :TOP_K].astype(np.int32)
    rows = np.arange(N_STEPS)[:, None]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "gemma3-270m.llamacpp.npz", tokens=np.array(tokens, dtype=np.int32), n_prompt=len(prompt),
             top_ids=top_ids, alone=alone[rows, top_ids], batch=batch[rows, top_ids])
    diff = np.abs(alone[rows, top_ids] - batch[rows, top_ids]).max()
    print(f"{out / 'gemma3-270m.llamacpp.npz'}: {len(prompt)} prompt tokens, {N_STEPS} steps; "
          f"alone vs batch: max |diff| over the top-{TOP_K} = {diff:.4g}, "
          f"full vocab = {np.abs(alone - batch).max():.4g}")
    L.llama_model_free(model)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
