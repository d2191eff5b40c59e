from typing import Any, Callable, List, Optional, Tuple

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

from ._gdn import Communicator

def communicator(group: Any = None, timeout: float = 60.0) -> Communicator:
    """A NCCL communicator over a torch.distributed group (collective; CUDA)."""

def run_virtual_ranks(ranks: int, fn: Callable[[Communicator], Any], device: str = "cpu",
                      timeout: float = 60.0) -> List[Any]:
    """fn(communicator) on `ranks` threads of this process; their results in rank order."""

def cp_chunk_gated_delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any, group: Communicator,
                              strategy: str = "auto", scale: Optional[float] = None,
                              initial_state: Optional[Any] = None,
                              output_final_state: bool = False, cu_seqlens: Optional[Any] = None,
                              use_qk_l2norm_in_kernel: bool = False
                              ) -> Tuple[Any, Optional[Any]]:
    """chunk_gated_delta_rule on this rank's shard of the tokens, with autograd."""

def context_parallel(module_or_model: torch.nn.Module, group: Any, strategy: str = "auto",
                     timeout: float = 60.0) -> int:
    """Shards every Qwen3.5 GatedDeltaNet's sequence over the group; returns how many."""
