"""``example_argmin``: select the least likely candidate.

The opposite of greedy, so that whether the plugin ran is never in doubt. Candidates another sampler
masked out (logit -inf, as logit-bias or grammar samplers do) are never selected.
"""
from __future__ import annotations

import numpy as np

from ggflow.core.sampling import TokenDataArray


class ArgMin:
    name = "example_argmin"

    def apply(self, cur: TokenDataArray) -> None:
        live = np.isfinite(cur.logits)
        if not live.any():
            return  # nothing selectable: leave `selected` unset rather than pick a masked token
        cur.selected = int(np.argmin(np.where(live, cur.logits, np.inf)))

    def accept(self, token: int) -> None:
        pass  # no history

    def reset(self) -> None:
        pass

    def clone(self) -> "ArgMin":
        return ArgMin()
