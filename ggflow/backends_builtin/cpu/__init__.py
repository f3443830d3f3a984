"""The built-in CPU backend plugin: numba/numpy kernels for every op.

Its parts: ``backend`` (the backend and its plan of bound kernels), ``fusion`` (chains run as one call),
``thread_choice`` / ``spare_cores`` / ``threads`` (how many threads a call gets), ``entry_points`` and
``jit_pages`` (calling and housekeeping numba), ``arrays`` and ``c_arith`` (views and ggml's float
arithmetic); ``products/`` (every matrix product) and ``ops/`` (every other op's kernels). Importing the
package loads no kernel: the hook imports the backend when the registries are built.
"""
from __future__ import annotations

from ggflow.plugins.hookspecs import hookimpl


@hookimpl
def register_backends(register):
    from ggflow.backends_builtin.cpu.backend import CPUBackend

    register(CPUBackend)
