"""The extension's low-level calls on DLPack tensors (gdn.ops wraps them for torch)."""

from typing import Any, Callable, List, Optional

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

class Communicator:
    """The ranks of one context-parallel group (host or device memory)."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def stream(self) -> int:
        """The CUDA stream that orders a device communicator's calls (0 on host)."""
    @property
    def bytes_sent(self) -> int: ...
    def send(self, data: Any, peer: int) -> None: ...
    def recv(self, data: Any, peer: int) -> None: ...
    def send_recv(self, send: Any, to: int, recv: Any, from_: int) -> None: ...
    def synchronize(self) -> None:
        """Waits for every call so far; raises if one failed or a peer timed out."""

def strategy_names() -> List[str]:
    """The context-parallel strategies (besides "auto")."""

def run_virtual_ranks(ranks: int, device: str, fn: Callable[[Communicator], Any],
                      timeout: float) -> List[Any]:
    """fn(communicator) on `ranks` threads; each rank's result in rank order."""

def nccl_unique_id() -> bytes:
    """A fresh NCCL unique id (CUDA builds)."""

def nccl_communicator(unique_id: bytes, rank: int, ranks: int, device: int,
                      timeout: float) -> Communicator:
    """Rank `rank` of a NCCL group on `device` (CUDA builds)."""

class CpOp:
    """One rank's side of the context-parallel op."""
    def __init__(self, comm: Communicator, strategy: str, save_for_backward: bool) -> None: ...
    def forward(self, q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Optional[Any],
                cu_seqlens: Optional[Any], o: Any, final_state: Optional[Any], scale: float,
                use_qk_l2norm: bool) -> None: ...
    def backward(self, q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Optional[Any],
                 cu_seqlens: Optional[Any], d_o: Any, d_final_state: Optional[Any], dq: Any,
                 dk: Any, dv: Any, dg: Any, dbeta: Any, dh0: Optional[Any], scale: float,
                 use_qk_l2norm: bool) -> None: ...
    @property
    def strategy(self) -> str: ...
