"""gdn.chunk_gated_delta_rule against a float64 token-by-token reference written here in torch,
its autograd (gradcheck), the custom ops' registration (opcheck), torch.compile, bad input and
DLPack. CUDA cases run when a GPU is visible and gdn was built with CUDA."""

import math

import pytest
import torch

import gdn

torch.manual_seed(0)


def reference(q, k, v, g, beta, scale, h0, cu_seqlens, l2norm):
    """The recurrence (spec 1) in float64: S <- exp(g) S + k beta (v - S^T k)^T, o = scale S^T q."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, HK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = HV // HK
    q, k = q.repeat_interleave(group, 2), k.repeat_interleave(group, 2)
    bounds = ([(b, 0, T) for b in range(B)] if cu_seqlens is None else
              [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)])
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    finals = []
    for n, (b, t0, t1) in enumerate(bounds):
        S = (h0[n].double().clone() if h0 is not None
             else torch.zeros(HV, K, V, dtype=torch.float64))
        for t in range(t0, t1):
            S = S * torch.exp(g[b, t])[:, None, None]
            err = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
            S = S + torch.einsum("hk,hv->hkv", k[b, t], beta[b, t][:, None] * err)
            o[b, t] = scale * torch.einsum("hkv,hk->hv", S, q[b, t])
        finals.append(S)
    return o, torch.stack(finals)


def inputs(B=2, T=37, HK=2, HV=4, K=16, V=8, dtype=torch.float32, device="cpu", varlen=None,
           h0=True):
    N = B if varlen is None else len(varlen)
    if varlen is not None:
        B, T = 1, sum(varlen)
    q = torch.randn(B, T, HK, K, dtype=dtype, device=device)
    k = torch.randn(B, T, HK, K, dtype=dtype, device=device)
    v = torch.randn(B, T, HV, V, dtype=dtype, device=device)
    g = -torch.exp(torch.randn(B, T, HV, device=device) - 2).to(
        torch.float64 if dtype == torch.float64 else torch.float32)
    beta = torch.rand(B, T, HV, dtype=dtype, device=device)
    state = (0.1 * torch.randn(N, HV, K, V, device=device)).to(
        torch.float64 if dtype == torch.float64 else torch.float32) if h0 else None
    cu = (None if varlen is None else
          torch.tensor([0] + list(torch.tensor(varlen).cumsum(0)), dtype=torch.int32,
                       device=device))
    return q, k, v, g, beta, state, cu


def rel(x, ref):
    return ((x.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()).item()


def check_against_reference(dtype, device, tol_out, tol_grad, varlen=None, l2norm=True, **shape):
    q, k, v, g, beta, h0, cu = inputs(dtype=dtype, device=device, varlen=varlen, **shape)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5],
                                       output_final_state=True, cu_seqlens=cu,
                                       use_qk_l2norm_in_kernel=l2norm)
    d_o, dht = torch.randn_like(o), torch.randn_like(ht)
    torch.autograd.backward([o, ht], [d_o, dht])
    ref_leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v, g, beta, h0)]
    scale = 1 / math.sqrt(q.shape[-1])
    ro, rht = reference(*ref_leaves[:5], scale, ref_leaves[5], None if cu is None else cu.cpu(),
                        l2norm)
    torch.autograd.backward([ro, rht], [d_o.cpu().double(), dht.cpu().double()])
    assert rel(o, ro) <= tol_out and rel(ht, rht) <= tol_out
    for name, mine, ref in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves, ref_leaves):
        assert rel(mine.grad, ref.grad) <= tol_grad, name


@pytest.mark.parametrize("varlen", [None, [5, 17, 1, 30]])
def test_cpu_f32_matches_float64(varlen):
    check_against_reference(torch.float32, "cpu", 1e-5, 1e-4, varlen=varlen)


def test_gradcheck_f64():
    q, k, v, g, beta, h0, _ = inputs(B=1, T=6, HK=1, HV=2, K=4, V=3, dtype=torch.float64)
    args = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]

    def f(q, k, v, g, beta, h0):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)

    assert torch.autograd.gradcheck(f, args)


def test_opcheck():
    q, k, v, g, beta, h0, _ = inputs(B=1, T=9, HK=1, HV=2, K=8, V=4)
    fwd = torch.ops.gdn.chunk_gated_delta_rule_fwd
    torch.library.opcheck(fwd, (q, k, v, g, beta, h0, None, 0.0, True, True))
    d_o, dht = torch.randn_like(v), torch.randn_like(h0)
    saved = torch.empty(0, dtype=torch.uint8)  # the CPU keeps nothing for the backward
    torch.library.opcheck(torch.ops.gdn.chunk_gated_delta_rule_bwd,
                          (q, k, v, g, beta, h0, None, saved, d_o, dht, 0.0, True))


def test_compile_fullgraph():
    q, k, v, g, beta, h0, _ = inputs(B=1, T=20, HK=1, HV=2, K=8, V=4)

    def f(q, k, v, g, beta, h0):
        o, ht = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                           output_final_state=True)
        return (o * o).sum() + ht.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(q, k, v, g, beta, h0), f(q, k, v, g, beta, h0))


def test_bad_input_names_the_argument():
    q, k, v, g, beta, h0, _ = inputs(B=1, T=8, HK=2, HV=4, K=8, V=4)
    with pytest.raises(ValueError, match="beta"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta[:, :4])
    with pytest.raises(ValueError, match="HV"):
        gdn.chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        gdn.chunk_gated_delta_rule([1.0], k, v, g, beta)


def test_numpy_through_dlpack():
    np = pytest.importorskip("numpy")
    q, k, v, g, beta, h0, _ = inputs(B=1, T=11, HK=1, HV=2, K=8, V=4)
    o, ht = gdn.chunk_gated_delta_rule(q.numpy(), k.numpy(), v.numpy(), g.numpy(), beta.numpy(),
                                       initial_state=h0.numpy(), output_final_state=True)
    assert isinstance(o, np.ndarray) and isinstance(ht, np.ndarray)
    to, tht = gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                         output_final_state=True)
    assert np.array_equal(o, to.numpy()) and np.array_equal(ht, tht.numpy())


cuda = pytest.mark.skipif(not (torch.cuda.is_available() and gdn.has_cuda),
                          reason="needs a CUDA GPU and gdn built with CUDA")


@cuda
@pytest.mark.parametrize("varlen", [None, [100, 3, 250, 64]])
def test_cuda_bf16_matches_float64(varlen):
    # bf16 inputs: the op's tolerance against float64 (tests/test_cuda_delta_rule.cpp).
    check_against_reference(torch.bfloat16, "cuda", 8e-3, 1.5e-2, varlen=varlen, B=2, T=300,
                            HK=2, HV=4, K=128, V=128)


@cuda
def test_cuda_graph_capture():
    q, k, v, g, beta, h0, _ = inputs(B=1, T=256, HK=1, HV=2, K=128, V=128, dtype=torch.bfloat16,
                                     device="cuda")
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]

    def step():  # l2norm: raw Gaussian keys of norm ~11 would make the recurrence blow up
        o, ht = gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5],
                                           output_final_state=True, use_qk_l2norm_in_kernel=True)
        (o.float().square().sum() + ht.sum()).backward()
        return o

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = step().detach().clone()  # warm-up on the side stream, as CUDA graphs ask
        eager_grads = [x.grad.clone() for x in leaves]
    torch.cuda.current_stream().wait_stream(stream)
    for x in leaves:
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(eager).all()
    assert torch.equal(out, eager)
    for x, ref in zip(leaves, eager_grads):  # dg, dbeta sum with float atomics: not bitwise
        assert rel(x.grad, ref) <= 1e-4


def test_readme_example():
    """The README's Python example runs as written (on the GPU when there is one)."""
    import pathlib
    import re

    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not beside the package")
    block = re.search(r"## Python and PyTorch\n\n```python\n(.*?)```", readme.read_text(), re.S)
    scope = {}
    exec(block.group(1), scope)
    assert scope["q"].grad is not None and scope["state"].shape == (1, 32, 128, 128)
