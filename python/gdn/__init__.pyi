from typing import Any, Optional, Tuple

import torch

has_cuda: bool
__version__: str

def chunk_gated_delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any,
                           scale: Optional[float] = None, initial_state: Optional[Any] = None,
                           output_final_state: bool = False, cu_seqlens: Optional[Any] = None,
                           use_qk_l2norm_in_kernel: bool = False) -> Tuple[Any, Optional[Any]]:
    """The gated delta rule with flash-linear-attention's signature: (o, final_state or None)."""

def patch_transformers(model_or_module: torch.nn.Module) -> int:
    """Routes every Qwen3.5 / Qwen3-Next GatedDeltaNet inside through gdn; returns how many."""
