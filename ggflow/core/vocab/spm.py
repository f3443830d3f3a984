"""SentencePiece-style BPE with byte fallback, as llama.cpp's llm_tokenizer_spm runs it.

llama.cpp merges the adjacent pair whose joined text is the vocabulary entry with the highest score
(leftmost first on ties); a BPE with merges ranked by score cannot reproduce those ties, so that
algorithm runs here, on a heap. Pieces that are not tokens fall back to byte tokens <0xNN>.
"""
from __future__ import annotations

import heapq

import numpy as np

from ggflow.core.vocab.errors import TokenizerError


class SpmMerger:
    """llama.cpp's llm_tokenizer_spm: merge the best-scoring adjacent pair until none is a token."""

    def __init__(self, token_to_id: dict[str, int], scores: np.ndarray):
        self.token_to_id = token_to_id
        self.scores = scores.astype(np.float64).tolist()
        self.byte_ids = [self._byte_token(token_to_id, b) for b in range(256)]

    @staticmethod
    def _byte_token(token_to_id: dict[str, int], b: int) -> int | None:
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = token_to_id.get(chr(b))
        return tid

    def encode(self, text: str) -> list[int]:
        """text: already space-escaped. Symbols start as code points; a merged symbol keeps the
        index of its left part, so symbol i always covers text[i:i + size[i]]."""
        n = len(text)
        if n == 0:
            return []
        token_to_id, scores = self.token_to_id, self.scores
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            tid = token_to_id.get(text[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)

        def push_pair(left: int, right: int) -> None:
            joined = size[left] + size[right]
            tid = token_to_id.get(text[left:left + joined])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, joined))

        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue    # one side changed since this pair was queued
            size[left], size[right] = joined, 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            if prev[left] >= 0:
                push_pair(prev[left], left)
            if after >= 0:
                push_pair(left, after)
        return self._emit(text, size, nxt)

    def _emit(self, text: str, size: list[int], nxt: list[int]) -> list[int]:
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            tid = self.token_to_id.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bytes_of(piece))
            i = nxt[i]
        return out

    def _bytes_of(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            tid = self.byte_ids[b]
            if tid is None:
                raise TokenizerError(f"{piece!r} is not in this SentencePiece vocabulary and it has no "
                                     f"byte token <0x{b:02X}> to fall back on")
            ids.append(tid)
        return ids
