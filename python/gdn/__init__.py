"""gdn: the Gated DeltaNet linear-attention op (the chunked gated delta rule), forward and
backward, on the CPU and on Hopper GPUs.

    import gdn
    o, final_state = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
"""

from . import _gdn
from .ops import chunk_gated_delta_rule
from .transformers_patch import patch_transformers

has_cuda = _gdn.has_cuda

__all__ = ["chunk_gated_delta_rule", "has_cuda", "patch_transformers"]
__version__ = "0.1.0"
