"""The extension's low-level calls on DLPack tensors (gdn.ops wraps them for torch)."""

from typing import Any, Optional

has_cuda: bool

def workspace_bytes(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Optional[Any],
                    cu_seqlens: Optional[Any], cu_seqlens_host: Optional[Any],
                    backward: bool, save: bool) -> int:
    """Device workspace bytes of a forward or backward on CUDA (0 on the CPU)."""

def saved_workspace_bytes(B: int, T: int, HK: int, HV: int, K: int, V: int, dtype: str,
                          beta_dtype: str, initial_state: bool, sequences: int) -> int:
    """Workspace bytes of a saving forward on CUDA from shapes alone (sequences: N, 0 without
    cu_seqlens)."""

def forward(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Optional[Any],
            cu_seqlens: Optional[Any], o: Any, final_state: Optional[Any], scale: float,
            use_qk_l2norm: bool, method: str, stream: int, workspace: Optional[Any],
            cu_seqlens_host: Optional[Any], save: bool) -> None:
    """o (and final_state) from the inputs, written into the given tensors."""

def backward(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Optional[Any],
             cu_seqlens: Optional[Any], d_o: Any, d_final_state: Optional[Any], dq: Any,
             dk: Any, dv: Any, dg: Any, dbeta: Any, dh0: Optional[Any], scale: float,
             use_qk_l2norm: bool, method: str, stream: int, workspace: Optional[Any],
             cu_seqlens_host: Optional[Any], forward_workspace: Optional[Any]) -> None:
    """Every gradient, written into the given tensors."""
