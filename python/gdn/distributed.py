"""Context parallelism from PyTorch: one sequence sharded over the ranks of a group, forward and
backward exact.

Every rank holds a contiguous shard of the tokens, [r T/P, (r+1) T/P). A group is a gdn
communicator: `communicator(torch_group)` makes a NCCL one from a torch.distributed group (one
GPU per process; the NCCL id goes through the group), `run_virtual_ranks` lends P of them to P
threads of this process (the tests' way: CPU, or ranks sharing one GPU).

    comm = gdn.communicator()                     # torch.distributed's default group, NCCL
    gdn.context_parallel(model, comm)             # every Qwen3.5 GatedDeltaNet layer, sharded
    out = model(input_ids=shard_of_ids)           # this rank's tokens

On device communicators every call runs on the communicator's stream, ordered after the
current stream's work and before its later work, with no host synchronization.
"""

import contextlib
from typing import Callable, List, Optional

import torch

from . import _gdn

Communicator = _gdn.Communicator
Tensor = torch.Tensor

STRATEGIES = ("auto",) + tuple(_gdn.strategy_names())


def communicator(group=None, timeout: float = 60.0) -> Communicator:
    """A NCCL communicator over the ranks of a torch.distributed group (the default group when
    None), on the current CUDA device. A collective call: every rank of the group calls it."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialized (init_process_group first)")
    if group is None:
        group = dist.group.WORLD
    if not _gdn.has_cuda or not torch.cuda.is_available():
        raise ValueError("group: a torch.distributed group gives gdn a NCCL communicator, which "
                         "needs CUDA; on the CPU use gdn.run_virtual_ranks")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    unique_id = [_gdn.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(unique_id, src=dist.get_global_rank(group, 0), group=group)
    return _gdn.nccl_communicator(unique_id[0], rank, size, torch.cuda.current_device(), timeout)


def run_virtual_ranks(ranks: int, fn: Callable[[Communicator], object], device: str = "cpu",
                      timeout: float = 60.0) -> List[object]:
    """fn(communicator) on `ranks` threads of this process, each a rank of one group; returns
    their results in rank order and raises the first rank's error. device "cpu": host memory;
    "cuda": the ranks share the current GPU, each on its own stream. A communicator is valid
    only while its fn runs. On "cuda", autograd's backward cannot run on several ranks at once
    (torch runs every CUDA backward of a process on one thread, so the ranks would wait on each
    other there): call the op's backward directly, or use NCCL with one process per GPU."""
    return _gdn.run_virtual_ranks(ranks, device, fn, timeout)


@contextlib.contextmanager
def _on_stream(comm: Communicator, like: Tensor):
    """Runs the block's library calls on a device communicator's stream, after the current
    stream's work and before its later work (no host synchronization)."""
    if comm.device != "cuda":
        yield
        return
    current = torch.cuda.current_stream(like.device)
    side = torch.cuda.ExternalStream(comm.stream, device=like.device)
    side.wait_stream(current)
    try:
        yield
    finally:
        current.wait_stream(side)


def _check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    return strategy


def _check_comm(comm) -> Communicator:
    if not isinstance(comm, Communicator):
        raise TypeError("group must be a gdn communicator (gdn.communicator(torch_group) or "
                        f"gdn.run_virtual_ranks), got {type(comm).__name__}")
    return comm


class _CpDeltaRule(torch.autograd.Function):
    """This rank's shard through the context-parallel op; the backward reuses the op object,
    which keeps what the forward saved (entering states, maps; on CUDA the chunk states)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, cu_seqlens, comm, strategy, scale, l2norm,
                output_final_state):
        training = any(ctx.needs_input_grad[:6])
        op = _gdn.CpOp(comm, strategy, training)
        n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
        final_state = (torch.zeros((n, v.shape[2], k.shape[3], v.shape[3]), dtype=torch.float32,
                                   device=q.device) if output_final_state else None)
        with _on_stream(comm, q):
            op.forward(q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, scale, l2norm)
        ctx.op, ctx.comm, ctx.scale, ctx.l2norm = op, comm, scale, l2norm
        ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens)
        ctx.set_materialize_grads(False)
        if final_state is None:
            return o, None
        return o, final_state

    @staticmethod
    def backward(ctx, d_o, d_final_state):
        q, k, v, g, beta, initial_state, cu_seqlens = ctx.saved_tensors
        d_o = torch.zeros_like(v) if d_o is None else d_o.contiguous()
        if d_final_state is not None:
            d_final_state = d_final_state.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dg, dbeta = torch.empty_like(g), torch.empty_like(beta)
        dh0 = torch.empty_like(initial_state) if initial_state is not None else None
        with _on_stream(ctx.comm, q):
            ctx.op.backward(q, k, v, g, beta, initial_state, cu_seqlens, d_o, d_final_state,
                            dq, dk, dv, dg, dbeta, dh0, ctx.scale, ctx.l2norm)
        return dq, dk, dv, dg, dbeta, dh0, None, None, None, None, None, None


def cp_chunk_gated_delta_rule(q, k, v, g, beta, group: Communicator, strategy: str = "auto",
                              scale: Optional[float] = None, initial_state=None,
                              output_final_state: bool = False, cu_seqlens=None,
                              use_qk_l2norm_in_kernel: bool = False):
    """gdn.chunk_gated_delta_rule on this rank's shard of the tokens (q, k, v, g, beta:
    [B, T/P, ...]), with autograd. cu_seqlens [N + 1] and initial_state [N, HV, K, V] are the
    global ones, the same on every rank. final_state's rows (and initial_state's gradient rows)
    are filled on the rank where their sequence ends (starts) and zero elsewhere: summed over the
    ranks they are the single-GPU result. Every rank must call it, with the same shapes."""
    comm = _check_comm(group)
    _check_strategy(strategy)
    tensors = [x if x is None else x.contiguous()
               for x in (q, k, v, g, beta, initial_state, cu_seqlens)]
    o, final_state = _CpDeltaRule.apply(*tensors, comm, strategy,
                                        0.0 if scale is None else float(scale),
                                        bool(use_qk_l2norm_in_kernel), bool(output_final_state))
    return o, final_state if output_final_state else None


class _Halo(torch.autograd.Function):
    """The previous rank's last w tokens ([B, C, w]; zeros on rank 0) for a causal conv of
    width w + 1. Its gradient flows back to that rank."""

    @staticmethod
    def forward(ctx, tail, comm):
        ctx.comm = comm
        halo = torch.zeros_like(tail)
        _shift(comm, tail, halo, +1)
        return halo

    @staticmethod
    def backward(ctx, d_halo):
        d_tail = torch.zeros_like(d_halo)
        _shift(ctx.comm, d_halo.contiguous(), d_tail, -1)
        return d_tail, None


def _shift(comm: Communicator, send: Tensor, recv: Tensor, step: int) -> None:
    """Every rank sends `send` to rank + step and receives `recv` from rank - step (the ends of
    the chain only send or only receive)."""
    to, frm = comm.rank + step, comm.rank - step
    has_to, has_from = 0 <= to < comm.size, 0 <= frm < comm.size
    with _on_stream(comm, send):
        if has_to and has_from:
            comm.send_recv(send, to, recv, frm)
        elif has_to:
            comm.send(send, to)
        elif has_from:
            comm.recv(recv, frm)


def causal_conv1d_with_halo(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation,
                            comm: Communicator) -> Tensor:
    """transformers' causal_conv1d_fn (x [B, C, T/P], weight [C, w + 1]) on a shard: the
    previous rank's last w tokens stand in for the zero padding."""
    width = weight.shape[-1] - 1
    if x.shape[-1] < width:
        raise ValueError(f"hidden_states: every rank needs at least {width} tokens for the conv "
                         f"halo, got {x.shape[-1]}")
    x = x.to(weight.dtype)
    halo = _Halo.apply(x[:, :, x.shape[-1] - width:].contiguous(), comm)
    out = torch.nn.functional.conv1d(torch.cat((halo, x), dim=-1), weight.unsqueeze(1), bias,
                                     groups=x.shape[1])
    if activation in ("silu", "swish"):
        out = torch.nn.functional.silu(out)
    elif activation is not None:
        raise ValueError(f"activation: gdn.context_parallel's conv supports silu, got "
                         f"{activation!r}")
    return out


def context_parallel(module_or_model, group, strategy: str = "auto",
                     timeout: float = 60.0) -> int:
    """Shards the sequence of every Qwen3.5 / Qwen3-Next GatedDeltaNet module in
    `module_or_model` (itself included) over `group`: each rank then calls the module (or the
    model) with its contiguous shard of the tokens, [B, T/P, hidden] (and its shard of a 2-D
    padding mask), and gets its shard of the output; the gated delta rule runs through gdn's
    context-parallel op and the causal conv reads the previous rank's last tokens. Forward and
    backward equal the unsharded module's. group: a gdn communicator, or a torch.distributed
    process group (None: the default one; NCCL, a collective call then). Returns how many modules it sharded. Decoding
    with a cache is not sharded (it raises)."""
    from . import transformers_patch

    _check_strategy(strategy)
    try:
        import torch.distributed as dist
        is_torch_group = dist.is_available() and isinstance(group, dist.ProcessGroup)
    except ImportError:
        is_torch_group = False
    if group is None or is_torch_group:
        comm = communicator(group, timeout)
    else:
        comm = _check_comm(group)
    return transformers_patch.shard_modules(module_or_model, comm, strategy)
