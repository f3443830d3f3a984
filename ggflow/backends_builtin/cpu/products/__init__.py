"""Matrix products: every ``mul_mat`` and ``mul_mat_id`` the CPU runs, and their drivers.

``matmul`` chooses a path per node: packed weights of a known type (``quant_matmul``, running the one
skeleton of ``qmm/`` with the type's pieces, ``pieces``), the batch-invariant fixed-order path for operands
that are not weights (``fixed_order``: attention over the KV cache), or a generic one; ``mul_mat_id`` runs
each chosen expert's packed weight over the tokens that chose it.
"""
