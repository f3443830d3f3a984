"""ggflow's built-in samplers, registered through the ``ggflow`` entry-point group like any plugin.

One module per family: basic (greedy, dist), truncation (top_k, top_p, min_p, typical, top_n_sigma,
xtc), temperature (temp, temp_ext), mirostat (mirostat, mirostat_v2), penalties (penalties, dry),
logit_bias; plus core's LogitsProcessorSampler adapter as ``logits_processor``.
"""
from __future__ import annotations

from ggflow.plugins import hookimpl


@hookimpl
def register_samplers(register):
    from ggflow.core.sampling import LogitsProcessorSampler
    from ggflow.samplers_builtin.basic import Dist, Greedy
    from ggflow.samplers_builtin.logit_bias import LogitBias
    from ggflow.samplers_builtin.mirostat import Mirostat, MirostatV2
    from ggflow.samplers_builtin.penalties import Dry, Penalties
    from ggflow.samplers_builtin.temperature import Temp, TempExt
    from ggflow.samplers_builtin.truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

    for factory in (Greedy, Dist, TopK, TopP, MinP, Typical, TopNSigma, XTC, Temp, TempExt,
                    Mirostat, MirostatV2, Penalties, Dry, LogitBias, LogitsProcessorSampler):
        register(factory)
