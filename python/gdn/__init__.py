"""gdn: the Gated DeltaNet linear-attention op (the chunked gated delta rule), forward and
backward, on the CPU and on Hopper GPUs.

    import gdn
    o, final_state = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)

Context parallelism (one sequence sharded over the ranks of a group): gdn.context_parallel for
transformers' Qwen3.5 layers, gdn.cp_chunk_gated_delta_rule for the op (gdn/distributed.py).
"""

from . import _gdn
from .distributed import (Communicator, communicator, context_parallel, cp_chunk_gated_delta_rule,
                          run_virtual_ranks)
from .ops import chunk_gated_delta_rule
from .transformers_patch import patch_transformers

has_cuda = _gdn.has_cuda

__all__ = ["Communicator", "chunk_gated_delta_rule", "communicator", "context_parallel",
           "cp_chunk_gated_delta_rule", "has_cuda", "patch_transformers", "run_virtual_ranks"]
__version__ = "0.1.0"
