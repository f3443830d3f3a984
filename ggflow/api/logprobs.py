"""Log-probabilities and their shapes (moved to ggflow.generation.logprobs; the names stay importable here)."""
from ggflow.generation.logprobs import (TokenLogprob, chat_logprobs, completion_logprobs, log_softmax,
                                        sequence_logprobs, token_logprob, top_logprobs)

__all__ = ["TokenLogprob", "chat_logprobs", "completion_logprobs", "log_softmax", "sequence_logprobs",
           "token_logprob", "top_logprobs"]
