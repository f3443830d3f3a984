"""The CPU kernels of every op other than the matrix products: attention's fused chain, elementwise,
norms, RoPE, soft_max, expert routing, row movement (get_rows, set_rows, cpy, cont) and plugin ops'
references, each in numba or vectorised numpy with ggml's arithmetic."""
