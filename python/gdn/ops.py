"""gdn.chunk_gated_delta_rule for PyTorch: torch.library custom ops (with fake implementations,
so torch.compile(fullgraph=True) and CUDA graphs see through them) and their autograd.

On CUDA: q, k, v (and beta) bf16 or f16, g f32, states f32, K = V = 128, on the current stream,
workspaces from torch's caching allocator, sized from shapes alone (cu_seqlens stays on the
device: nothing synchronizes the host, and cu_seqlens' offsets are trusted to be valid). A
training forward keeps its intermediates (an output of the op) and the backward reads them. On
the CPU: f32 (the chunked path) or f64 (the float64 recurrence, for gradcheck).
"""

from typing import Optional, Tuple

import torch

from . import _gdn

Tensor = torch.Tensor


def _method(q: Tensor) -> str:
    return "recurrent" if q.dtype == torch.float64 else "chunked"


def _state_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _stream(q: Tensor) -> int:
    return torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0


def _workspace(q, k, v, g, beta, h0, cu_seqlens, backward, save=False) -> Optional[Tensor]:
    if not q.is_cuda:
        return None
    nbytes = _gdn.workspace_bytes(q, k, v, g, beta, h0, cu_seqlens, None, backward, save)
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=q.device)


_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _saved_bytes(q, k, v, beta, initial_state, cu_seqlens, training) -> int:
    """Bytes of the intermediates a training forward keeps for its backward (CUDA), from shapes
    alone so that the fake implementation knows them too."""
    if not training or q.device.type != "cuda" or q.dtype not in _DTYPE_NAMES:
        return 0
    B, T, HK, K = q.shape
    sequences = 0 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return _gdn.saved_workspace_bytes(B, T, HK, v.shape[2], K, v.shape[3], _DTYPE_NAMES[q.dtype],
                                      _DTYPE_NAMES.get(beta.dtype, "?"), initial_state is not None,
                                      sequences)


def _sequences(q: Tensor, cu_seqlens: Optional[Tensor]) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("gdn::chunk_gated_delta_rule_fwd", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
             initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], scale: float,
             use_qk_l2norm: bool, training: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(o, final_state, saved): saved holds the intermediates for the backward (may be empty)."""
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    final_state = torch.empty((_sequences(q, cu_seqlens), v.shape[2], k.shape[3], v.shape[3]),
                              dtype=_state_dtype(q), device=q.device)
    saved_bytes = _saved_bytes(q, k, v, beta, initial_state, cu_seqlens, training)
    saved = torch.empty(saved_bytes, dtype=torch.uint8, device=q.device)
    workspace = saved if saved_bytes else _workspace(q, k, v, g, beta, initial_state, cu_seqlens,
                                                     False)
    _gdn.forward(q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, scale,
                 use_qk_l2norm, _method(q), _stream(q), workspace, None, saved_bytes > 0)
    return o, final_state, saved


@_forward.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm, training):
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    saved_bytes = _saved_bytes(q, k, v, beta, initial_state, cu_seqlens, training)
    return (q.new_empty(v.shape),
            q.new_empty((n, v.shape[2], k.shape[3], v.shape[3]), dtype=_state_dtype(q)),
            q.new_empty(saved_bytes, dtype=torch.uint8))


@torch.library.custom_op("gdn::chunk_gated_delta_rule_bwd", mutates_args=())
def _backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
              initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor], saved: Tensor,
              d_o: Tensor, d_final_state: Optional[Tensor], scale: float,
              use_qk_l2norm: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg, dbeta = torch.empty_like(g), torch.empty_like(beta)
    dh0 = torch.empty_like(initial_state) if initial_state is not None else q.new_empty(0)
    reuse = saved.numel() > 0
    workspace = _workspace(q, k, v, g, beta, initial_state, cu_seqlens, True, reuse)
    _gdn.backward(q, k, v, g, beta, initial_state, cu_seqlens, d_o, d_final_state,
                  dq, dk, dv, dg, dbeta, dh0 if initial_state is not None else None, scale,
                  use_qk_l2norm, _method(q), _stream(q), workspace, None,
                  saved if reuse else None)
    return dq, dk, dv, dg, dbeta, dh0


@_backward.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, saved, d_o, d_final_state, scale,
      use_qk_l2norm):
    dh0 = torch.empty_like(initial_state) if initial_state is not None else q.new_empty(0)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g),
            torch.empty_like(beta), dh0)


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm, _ = inputs
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, output[2])
    ctx.scale, ctx.use_qk_l2norm = scale, use_qk_l2norm
    # The intermediates are no output to differentiate, and unused outputs' gradients stay None:
    # materializing them would zero-fill the whole saved workspace every step.
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)


def _autograd_backward(ctx, d_o, d_final_state, _d_saved):
    q, k, v, g, beta, initial_state, cu_seqlens, saved = ctx.saved_tensors
    if d_o is None:
        d_o = torch.zeros_like(v)
    if d_final_state is not None:
        d_final_state = d_final_state.contiguous()  # sum()'s gradient comes expanded
    dq, dk, dv, dg, dbeta, dh0 = _backward(q, k, v, g, beta, initial_state, cu_seqlens, saved,
                                           d_o.contiguous(), d_final_state, ctx.scale,
                                           ctx.use_qk_l2norm)
    return (dq, dk, dv, dg, dbeta, dh0 if initial_state is not None else None, None, None, None,
            None)


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _check_tensor(name: str, x, required: bool = True) -> None:
    if x is None and not required:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (or a DLPack tensor), got {type(x).__name__}")


def chunk_gated_delta_rule(q, k, v, g, beta, scale: Optional[float] = None,
                           initial_state=None, output_final_state: bool = False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel: bool = False):
    """The gated delta rule, flash-linear-attention's chunk_gated_delta_rule signature.

    q, k: [B, T, HK, K]; v: [B, T, HV, V] (HV a multiple of HK); g (log decay), beta: [B, T, HV];
    initial_state: [N, HV, K, V]; cu_seqlens: [N + 1] int32/int64 offsets of packed sequences
    (B = 1). Returns (o [B, T, HV, V], final_state [N, HV, K, V] or None). Differentiable in q, k,
    v, g, beta and initial_state. Other DLPack tensors (numpy, JAX, CuPy) are accepted for the
    forward and the results come back as the same kind.
    """
    if not isinstance(q, torch.Tensor) and hasattr(q, "__dlpack__"):
        return _through_dlpack(q, k, v, g, beta, scale, initial_state, output_final_state,
                               cu_seqlens, use_qk_l2norm_in_kernel)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check_tensor(name, x)
    _check_tensor("initial_state", initial_state, required=False)
    _check_tensor("cu_seqlens", cu_seqlens, required=False)
    if scale is None:
        scale = 0.0  # the library's default, K^-1/2
    tensors = [x if x is None else x.contiguous()
               for x in (q, k, v, g, beta, initial_state, cu_seqlens)]
    training = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in tensors[:6])
    o, final_state, _ = _forward(*tensors, float(scale), bool(use_qk_l2norm_in_kernel), training)
    return o, final_state if output_final_state else None


def _through_dlpack(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                    use_qk_l2norm):
    import sys

    module = sys.modules[type(q).__module__.split(".")[0]]
    as_torch = [None if x is None else torch.from_dlpack(x)
                for x in (q, k, v, g, beta, initial_state, cu_seqlens)]
    with torch.no_grad():
        o, final_state = chunk_gated_delta_rule(*as_torch[:5], scale, as_torch[5],
                                                output_final_state, as_torch[6], use_qk_l2norm)
    back = module.from_dlpack
    return back(o), (None if final_state is None else back(final_state))
