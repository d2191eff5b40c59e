"""gdn.patch_transformers: run the gated delta rule of transformers' Qwen3.5 / Qwen3-Next
GatedDeltaNet modules through gdn.

transformers' GatedDeltaNet.forward calls the module-level name `torch_chunk_gated_delta_rule`
of its modeling module (looked up at call time; bound to flash-linear-attention's op when `fla`
imports, else to transformers' torch loop). The patch rebinds that name once per modeling module
to a dispatcher, and wraps each patched instance's forward so that, while it runs, the dispatcher
sends the call to gdn; other instances keep the original. Decoding steps with a cache (one token)
go through `torch_recurrent_gated_delta_rule` and are left as they are.
"""

import contextvars
import functools
import sys

from .ops import chunk_gated_delta_rule

_NAME = "torch_chunk_gated_delta_rule"
_active = contextvars.ContextVar("gdn_patched_forward", default=False)


def _dispatcher(original):
    @functools.wraps(original)
    def dispatch(query, key, value, g, beta, chunk_size=64, initial_state=None,
                 output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                 **kwargs):
        if not _active.get():
            return dispatch._gdn_original(query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                            initial_state=initial_state, output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            cu_seqlens=cu_seqlens, **kwargs)
        # transformers scales q by K^-1/2, gdn's default.
        return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      cu_seqlens=cu_seqlens,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    dispatch._gdn_original = original
    return dispatch


def _patched_forward(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        token = _active.set(True)
        try:
            return forward(*args, **kwargs)
        finally:
            _active.reset(token)

    run._gdn_patched = True
    return run


def patch_transformers(model_or_module) -> int:
    """Makes every Qwen3.5 / Qwen3-Next GatedDeltaNet module in `model_or_module` (a
    torch.nn.Module, itself included) run its chunked gated delta rule through gdn. Returns how
    many modules it patched (already patched ones are not counted again)."""
    patched = 0
    for module in model_or_module.modules():
        if not type(module).__name__.endswith("GatedDeltaNet"):
            continue
        modeling = sys.modules.get(type(module).__module__)
        original = getattr(modeling, _NAME, None)
        if original is None:
            continue
        if not hasattr(original, "_gdn_original"):
            setattr(modeling, _NAME, _dispatcher(original))
        if getattr(module.forward, "_gdn_patched", False):
            continue
        module.forward = _patched_forward(module.forward)
        patched += 1
    return patched
