"""gdn.patch_transformers and gdn.context_parallel's module side: transformers' Qwen3.5 /
Qwen3-Next GatedDeltaNet modules running their gated delta rule (and, sharded, their causal conv)
through gdn.

transformers' GatedDeltaNet.forward calls the module-level names `torch_chunk_gated_delta_rule`
and `causal_conv1d_fn` of its modeling module (looked up at call time; possibly bound to
flash-linear-attention's or a kernel hub's functions). We rebind each name once per modeling
module to a dispatcher, and wrap each patched instance's forward so that, while it runs, a
context variable routes the calls: to gdn's op (patch_transformers), or to the context-parallel
op and the conv with a halo (context_parallel); other instances keep the originals. Decoding
steps with a cache (one token) go through `torch_recurrent_gated_delta_rule` and are left as they
are (and refused when sharded).
"""

import contextvars
import functools
import sys

from .ops import chunk_gated_delta_rule

_OP = "torch_chunk_gated_delta_rule"
_CONV = "causal_conv1d_fn"
_PACKING = ("seq_idx", "cu_seqlens", "cu_seq_lens_q")  # the conv's keywords that pack sequences


class _Shard:
    """How a sharded module's calls go: its group, strategy, and whether the conv was routed."""

    def __init__(self, comm, strategy):
        self.comm, self.strategy, self.conv_calls = comm, strategy, 0


# None: the originals; "gdn": gdn's op; a _Shard: the context-parallel op and conv.
_route = contextvars.ContextVar("gdn_route", default=None)


def _op_dispatcher(original):
    @functools.wraps(original)
    def dispatch(query, key, value, g, beta, chunk_size=64, initial_state=None,
                 output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                 **kwargs):
        route = _route.get()
        if route is None:
            return dispatch._gdn_original(query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                            initial_state=initial_state, output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            cu_seqlens=cu_seqlens, **kwargs)
        # transformers scales q by K^-1/2, gdn's default.
        if route == "gdn":
            return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                          output_final_state=output_final_state,
                                          cu_seqlens=cu_seqlens,
                                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        from .distributed import cp_chunk_gated_delta_rule

        if cu_seqlens is not None:
            raise ValueError("cu_seq_lens_q: packed sequences are not sharded by "
                             "gdn.context_parallel's module wrapper (call "
                             "gdn.cp_chunk_gated_delta_rule with cu_seqlens instead)")
        return cp_chunk_gated_delta_rule(query, key, value, g, beta, route.comm, route.strategy,
                                         initial_state=initial_state,
                                         output_final_state=output_final_state,
                                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    dispatch._gdn_original = original
    return dispatch


def _conv_dispatcher(original):
    @functools.wraps(original)
    def dispatch(hidden_states, weight, bias=None, activation=None, **kwargs):
        route = _route.get()
        if not isinstance(route, _Shard):
            return dispatch._gdn_original(hidden_states, weight, bias, activation=activation,
                                          **kwargs)
        from .distributed import causal_conv1d_with_halo

        packed = [name for name in _PACKING if kwargs.get(name) is not None]
        if packed:
            raise ValueError(f"{', '.join(packed)}: packed sequences are not sharded by "
                             "gdn.context_parallel's module wrapper")
        route.conv_calls += 1
        out = causal_conv1d_with_halo(hidden_states, weight, bias, activation, route.comm)
        return out.to(hidden_states.dtype)

    dispatch._gdn_original = original
    return dispatch


def _rebind(modeling, name, make_dispatcher) -> bool:
    original = getattr(modeling, name, None)
    if original is None:
        return False
    if not hasattr(original, "_gdn_original"):
        setattr(modeling, name, make_dispatcher(original))
    return True


def _routed_forward(forward, route):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        token = _route.set(route)
        try:
            return forward(*args, **kwargs)
        finally:
            _route.reset(token)

    run._gdn_route = route
    return run


def _sharded_forward(forward, shard, name):
    @functools.wraps(forward)
    def run(hidden_states, *args, **kwargs):
        cache = args[0] if args else kwargs.get("cache", kwargs.get("cache_params"))
        if cache is not None:
            raise ValueError("cache: gdn.context_parallel shards training and prefill without a "
                             "cache; decoding with a cache is not sharded")
        token = _route.set(shard)
        calls = shard.conv_calls
        try:
            out = forward(hidden_states, *args, **kwargs)
        finally:
            _route.reset(token)
        if shard.comm.size > 1 and shard.conv_calls == calls:
            raise RuntimeError(f"{name}.forward did not call its "
                               f"modeling module's {_CONV}, so its conv could not read the "
                               "previous rank's tokens: this transformers version is not "
                               "supported by gdn.context_parallel")
        return out

    run._gdn_route = shard
    return run


def _gated_delta_nets(model_or_module):
    for module in model_or_module.modules():
        if type(module).__name__.endswith("GatedDeltaNet"):
            yield module, sys.modules.get(type(module).__module__)


def patch_transformers(model_or_module) -> int:
    """Makes every Qwen3.5 / Qwen3-Next GatedDeltaNet module in `model_or_module` (a
    torch.nn.Module, itself included) run its chunked gated delta rule through gdn. Returns how
    many modules it patched (already patched ones are not counted again)."""
    patched = 0
    for module, modeling in _gated_delta_nets(model_or_module):
        if not _rebind(modeling, _OP, _op_dispatcher):
            continue
        if getattr(module.forward, "_gdn_route", None) is not None:
            continue
        module.forward = _routed_forward(module.forward, "gdn")
        patched += 1
    return patched


def shard_modules(model_or_module, comm, strategy) -> int:
    """gdn.context_parallel's work on the modules (distributed.py has the rest)."""
    sharded = 0
    for module, modeling in _gated_delta_nets(model_or_module):
        if not (_rebind(modeling, _OP, _op_dispatcher) and _rebind(modeling, _CONV,
                                                                   _conv_dispatcher)):
            raise ValueError(f"{type(module).__name__}: its modeling module has no {_OP} and "
                             f"{_CONV} to route: this transformers version is not supported by "
                             "gdn.context_parallel")
        forward = module.forward
        while hasattr(forward, "_gdn_route"):  # re-sharding (or sharding a patched module)
            forward = forward.__wrapped__
        module.forward = _sharded_forward(forward, _Shard(comm, strategy), type(module).__name__)
        sharded += 1
    return sharded
