"""Context parallelism from PyTorch: gdn.cp_chunk_gated_delta_rule and gdn.context_parallel over
P ranks give the unsharded results, forward and backward.

On the CPU the ranks are threads of this process (gdn.run_virtual_ranks) and autograd runs on
each. The sharded op is held to the single-rank gdn op within 2e-5: in float32 the strategies
only reorder sums of terms of like size, about 1e-6 here, while a wrong halo, mask or state is
off by 1e-2 or more. A sharded transformers layer or model is held to its unsharded float64 self
run through gdn (gdn.patch_transformers on the double module: gdn's float64 recurrence;
transformers' own torch loop computes in float32 whatever its inputs' dtype, so a double module
left to it is no float64 reference): every output and gradient within twice the error of the
unsharded float32 module run through gdn, plus 2e-6. A parameter's gradient sums per-token terms
that can largely cancel, so its error can be far above float32's epsilon for the single-rank
module too (dt_bias and A_log about 1e-2 in test_model_cpu, for transformers' float32 loop as for
gdn); the bound follows it instead of a fixed number. On the H200: virtual
ranks sharing the GPU (forward through the wrapper; backward through the op object, since torch
runs every CUDA backward of a process on one thread) and a real NCCL group made from
torch.distributed (one process)."""

import copy

import pytest
import torch

import gdn
from gdn import _gdn

cuda = pytest.mark.skipif(not (torch.cuda.is_available() and gdn.has_cuda),
                          reason="needs a CUDA GPU")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def op_inputs(B, T, HK, HV, K, V, N=0, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    q, k, v = r(B, T, HK, K), r(B, T, HK, K), r(B, T, HV, V)
    g = -torch.rand(B, T, HV, generator=gen) * 0.5 - 0.01
    beta = torch.rand(B, T, HV, generator=gen)
    n = N if N else B
    h0 = r(n, HV, K, V) * 0.1
    cu = None
    if N:
        cuts = sorted(torch.randperm(T - 1, generator=gen)[:N - 1].add(1).tolist())
        cu = torch.tensor([0] + cuts + [T], dtype=torch.int64, device=device)
    to = lambda x, dt=dtype: x.to(device=device, dtype=dt)  # noqa: E731
    return (to(q), to(k), to(v), to(g, torch.float32), to(beta), to(h0, torch.float32), cu)


def shard(x, rank, ranks):
    T = x.shape[1]
    return x[:, rank * T // ranks:(rank + 1) * T // ranks]


def grads_of(run, inputs, d_o, d_final):
    leaves = [x.clone().requires_grad_() for x in inputs[:6]]
    o, final = run(*leaves, inputs[6])
    torch.autograd.backward([o, final], [d_o, d_final])
    return o.detach(), final.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("strategy", gdn.distributed.STRATEGIES)
@pytest.mark.parametrize("ranks,B,N", [(2, 2, 0), (3, 1, 3), (4, 1, 0)])
def test_op_cpu(strategy, ranks, B, N):
    HK, HV = 2, 4
    if strategy == "ulysses" and (HK % ranks or HV % ranks):
        pytest.skip("ulysses needs the heads divisible by the ranks")
    inputs = op_inputs(B, 24 * ranks, HK, HV, 16, 16, N)
    d_o = torch.randn(inputs[2].shape)
    d_final = torch.randn(inputs[5].shape)

    def single(q, k, v, g, beta, h0, cu):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True)

    want = grads_of(single, inputs, d_o, d_final)

    def rank_fn(comm):
        def sharded(q, k, v, g, beta, h0, cu):
            return gdn.cp_chunk_gated_delta_rule(
                q, k, v, g, beta, comm, strategy, initial_state=h0, output_final_state=True,
                cu_seqlens=cu, use_qk_l2norm_in_kernel=True)

        mine = [shard(x, comm.rank, comm.size) for x in inputs[:5]] + list(inputs[5:])
        return grads_of(sharded, mine, shard(d_o, comm.rank, comm.size), d_final)

    got = gdn.run_virtual_ranks(ranks, rank_fn)
    o = torch.cat([r[0] for r in got], dim=1)
    final = sum(r[1] for r in got)  # each row lives on the rank where its sequence ends
    assert rel(o, want[0]) < 2e-5 and rel(final, want[1]) < 2e-5
    for i, name in enumerate(["dq", "dk", "dv", "dg", "dbeta"]):
        assert rel(torch.cat([r[2][i] for r in got], dim=1), want[2][i]) < 2e-5, name
    assert rel(sum(r[2][5] for r in got), want[2][5]) < 2e-5, "dh0"


modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402


def tiny_config(head_dim=16, layers=1):
    return Qwen3_5TextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                             linear_conv_kernel_dim=4, num_hidden_layers=layers,
                             intermediate_size=96, vocab_size=128,
                             layer_types=["linear_attention"] * layers)


def tiny_layer(head_dim=16):
    torch.manual_seed(0)
    return modeling.Qwen3_5GatedDeltaNet(tiny_config(head_dim), layer_idx=0)


def patched(module):
    copied = copy.deepcopy(module)
    gdn.patch_transformers(copied)
    return copied


def assert_as_accurate(sharded, single, exact):
    """Output, input gradient and every parameter gradient of the sharded run within twice the
    unsharded gdn run's error against float64, plus 2e-6."""
    pairs = [("output", 0, None), ("input gradient", 1, None)] if len(exact) == 3 else [
        ("output", 0, None)]
    pairs += [(name, len(exact) - 1, name) for name in exact[-1]]
    for what, i, name in pairs:
        pick = (lambda r: r[i]) if name is None else (lambda r: r[i][name])  # noqa: E731
        bound = 2 * rel(pick(single), pick(exact)) + 2e-6
        assert rel(pick(sharded), pick(exact)) <= bound, what


def layer_run(layer, x, mask, d_out):
    x = x.clone().requires_grad_()
    out = layer(x, attention_mask=mask)
    out.backward(d_out)
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("strategy", ["auto", "relay", "summary-allgather", "ulysses"])
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("masked", [False, True])
def test_layer_cpu(strategy, ranks, masked):
    layer = tiny_layer()
    if strategy == "ulysses" and layer.num_k_heads % ranks:
        pytest.skip("ulysses needs the heads divisible by the ranks (test_errors has the message)")
    T = 16 * ranks
    x = torch.randn(2, T, 64)
    mask = None
    if masked:  # left padding on the second sequence, across the first rank's whole shard
        mask = torch.ones(2, T, dtype=torch.int64)
        mask[1, :T // ranks + 3] = 0
    d_out = torch.randn(2, T, 64)
    exact = layer_run(patched(layer).double(), x.double(), mask, d_out.double())
    single = layer_run(patched(layer), x, mask, d_out)

    def rank_fn(comm):
        mine = copy.deepcopy(layer)
        assert gdn.context_parallel(mine, comm, strategy) == 1
        r, P = comm.rank, comm.size
        return layer_run(mine, shard(x, r, P), None if mask is None else shard(mask, r, P),
                         shard(d_out, r, P))

    got = gdn.run_virtual_ranks(ranks, rank_fn)
    sharded = (torch.cat([r[0] for r in got], dim=1), torch.cat([r[1] for r in got], dim=1),
               {name: sum(r[2][name] for r in got) for name in exact[2]})  # replicated: add up
    assert_as_accurate(sharded, single, exact)


def test_model_cpu():
    """A whole (linear-attention-only) Qwen3.5 text model, two layers, each rank fed its shard
    of the token ids: the last hidden state and every parameter gradient match."""
    torch.manual_seed(0)
    model = modeling.Qwen3_5TextModel(tiny_config(layers=2))
    ids = torch.randint(0, 128, (1, 48))
    d_out = torch.randn(1, 48, 64)

    def run(m, ids, d):
        out = m(input_ids=ids, use_cache=False).last_hidden_state
        out.backward(d.to(out.dtype))
        return out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    exact = run(patched(model).double(), ids, d_out)
    single = run(patched(model), ids, d_out)

    def rank_fn(comm):
        mine = copy.deepcopy(model)
        assert gdn.context_parallel(mine, comm) == 2
        return run(mine, shard(ids, comm.rank, 3), shard(d_out, comm.rank, 3))

    got = gdn.run_virtual_ranks(3, rank_fn)
    sharded = (torch.cat([r[0] for r in got], dim=1),
               {name: sum(r[1][name] for r in got) for name in exact[1]})
    assert_as_accurate(sharded, single, exact)


def test_errors():
    layer = tiny_layer()
    with pytest.raises(ValueError, match="strategy must be one of"):
        gdn.run_virtual_ranks(2, lambda comm: gdn.context_parallel(layer, comm, "ring"))
    with pytest.raises(TypeError, match="group must be a gdn communicator"):
        gdn.context_parallel(layer, 3)

    def too_short(comm):  # 2 tokens a rank, the conv needs 3 from the previous one
        mine = copy.deepcopy(layer)
        gdn.context_parallel(mine, comm)
        mine(torch.randn(1, 2, 64))

    with pytest.raises(ValueError, match="at least 3 tokens"):
        gdn.run_virtual_ranks(2, too_short)

    def with_cache(comm):
        mine = copy.deepcopy(layer)
        gdn.context_parallel(mine, comm)
        mine(torch.randn(1, 8, 64), cache=object())

    with pytest.raises(ValueError, match="cache"):
        gdn.run_virtual_ranks(2, with_cache)

    def unequal(comm):  # rank 1 holds more tokens than rank 0
        q, k, v, g, beta, _, _ = op_inputs(1, 8 * (comm.rank + 1), 2, 4, 16, 16)
        gdn.cp_chunk_gated_delta_rule(q, k, v, g, beta, comm)

    with pytest.raises(ValueError, match="rank"):
        gdn.run_virtual_ranks(2, unequal, timeout=20)

    def ulysses_indivisible(comm):  # 2 key heads cannot be dealt to 4 ranks
        q, k, v, g, beta, _, _ = op_inputs(1, 32, 2, 4, 16, 16)
        mine = [shard(x, comm.rank, comm.size) for x in (q, k, v, g, beta)]
        gdn.cp_chunk_gated_delta_rule(*mine, comm, "ulysses")

    with pytest.raises(ValueError, match=r"ulysses needs HK \(2\) and HV \(4\) divisible"):
        gdn.run_virtual_ranks(4, ulysses_indivisible)

    kept = gdn.run_virtual_ranks(2, lambda comm: comm)
    with pytest.raises(ValueError, match="run_virtual_ranks call that has returned"):
        kept[0].rank


@cuda
def test_op_cuda_virtual_ranks():
    """Forward through gdn.cp_chunk_gated_delta_rule and backward through the op object on 4
    ranks sharing the GPU, against the single-GPU op (bf16 operands: both ~4e-3 from float64,
    so they differ by about that much; 2e-2 catches a wrong shard or state)."""
    inputs = op_inputs(1, 4096, 2, 4, 128, 128, N=3, dtype=torch.bfloat16, device="cuda")
    q, k, v, g, beta, h0, cu = inputs
    d_o = torch.randn_like(v)
    leaves = [x.clone().requires_grad_() for x in inputs[:6]]
    o, final = gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5],
                                          output_final_state=True, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True)
    o.backward(d_o)
    want = [o.detach(), final.detach()] + [x.grad for x in leaves]

    def rank_fn(comm):
        r, P = comm.rank, comm.size
        mine = [shard(x, r, P).contiguous() for x in inputs[:5]]
        with torch.no_grad():
            o, final = gdn.cp_chunk_gated_delta_rule(*mine, comm, "summary-chain",
                                                     initial_state=h0, output_final_state=True,
                                                     cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
        op = _gdn.CpOp(comm, "summary-chain", False)
        o2 = torch.empty_like(mine[2])
        side = torch.cuda.ExternalStream(comm.stream)
        side.wait_stream(torch.cuda.current_stream())
        grads = [torch.empty_like(x) for x in mine] + [torch.empty_like(h0)]
        op.forward(*mine, h0, cu, o2, None, 0.0, True)
        op.backward(*mine, h0, cu, shard(d_o, r, P).contiguous(), None, *grads, 0.0, True)
        torch.cuda.current_stream().wait_stream(side)
        comm.synchronize()
        return o, final, grads

    got = gdn.run_virtual_ranks(4, rank_fn, device="cuda")
    torch.cuda.synchronize()
    assert rel(torch.cat([r[0] for r in got], dim=1), want[0]) < 2e-2
    assert rel(sum(r[1] for r in got), want[1]) < 2e-2
    for i, name in enumerate(["dq", "dk", "dv", "dg", "dbeta"]):
        assert rel(torch.cat([r[2][i] for r in got], dim=1), want[2 + i]) < 2e-2, name
    assert rel(sum(r[2][5] for r in got), want[7]) < 2e-2, "dh0"


@cuda
def test_layer_cuda_virtual_ranks():
    layer = tiny_layer(head_dim=128).cuda().to(torch.bfloat16)
    x = torch.randn(2, 1024, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(x)

    def rank_fn(comm):
        mine = copy.deepcopy(layer)
        gdn.context_parallel(mine, comm)
        with torch.no_grad():
            return mine(shard(x, comm.rank, comm.size))

    got = gdn.run_virtual_ranks(4, rank_fn, device="cuda")
    assert rel(torch.cat(got, dim=1), want) < 2e-2


@cuda
def test_layer_cuda_nccl_group(tmp_path):
    """torch.distributed's NCCL group (one process: the machine has one GPU) through
    gdn.context_parallel(model, None): the NCCL id travels through the group, autograd runs."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        layer = tiny_layer(head_dim=128).cuda().to(torch.bfloat16)
        x = torch.randn(2, 512, 64, device="cuda", dtype=torch.bfloat16)
        d_out = torch.randn_like(x)
        want = layer_run(copy.deepcopy(layer), x, None, d_out)
        mine = copy.deepcopy(layer)
        assert gdn.context_parallel(mine, None) == 1
        got = layer_run(mine, x, None, d_out)
        assert rel(got[0], want[0]) < 2e-2 and rel(got[1], want[1]) < 2e-2
        for name, grad in want[2].items():
            assert rel(got[2][name], grad) < 2e-2, name
    finally:
        dist.destroy_process_group()
