"""Generation: the one loop under ``LLM`` and ``ggflow serve``.

An ``Engine`` (engine.py) holds slots over one Context's KV cache and runs one ``Context.decode`` per step for
all of them; a ``Slot`` (slot.py) is one sequence id and the request it serves; its ``SequenceState``
(sequence.py) turns sampled tokens into text and, at the end, a ``Completion`` (records.py). ``LLM`` is an
engine with one slot stepped in the caller's thread; the server runs one on its own thread; both submit a
``Request`` (request.py) and read its ``Piece`` / ``Done`` events. Beside them: stop strings (stop.py),
log-probabilities and their OpenAI shapes (logprobs.py), context shift (context_shift.py), slot choice by
cached prefix (admission.py), greedy rows in one argmax (greedy_rows.py), offline batches (batch.py).
"""
