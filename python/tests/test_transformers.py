"""gdn.patch_transformers on transformers' Qwen3.5 GatedDeltaNet: the patched module gives the
unpatched one's output and parameter gradients (CPU f32 within 1e-4; the H200 in bf16 within the
op's error), and transformers' own gated delta rule is no longer entered."""

import copy

import pytest
import torch

import gdn

modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402


def tiny_layer(head_dim=16):
    config = Qwen3_5TextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
                               linear_conv_kernel_dim=4, num_hidden_layers=1)
    torch.manual_seed(0)
    return modeling.Qwen3_5GatedDeltaNet(config, layer_idx=0)


def run(layer, x):
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(torch.ones_like(out) / out.numel() ** 0.5)
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def compare(layer, x, tol):
    reference = copy.deepcopy(layer)
    assert gdn.patch_transformers(layer) == 1
    assert gdn.patch_transformers(layer) == 0  # already patched
    dispatch = modeling.torch_chunk_gated_delta_rule
    original, entered = dispatch._gdn_original, []

    def spy(*args, **kwargs):  # transformers' own gated delta rule, counted
        entered.append(True)
        return original(*args, **kwargs)

    dispatch._gdn_original = spy
    try:
        patched = run(layer, x)
        assert not entered, "the patched module entered transformers' gated delta rule"
        unpatched = run(reference, x)
    finally:
        dispatch._gdn_original = original
    assert entered, "the unpatched module must run transformers' gated delta rule"
    assert rel(patched[0], unpatched[0]) <= tol and rel(patched[1], unpatched[1]) <= tol
    for name, grad in patched[2].items():
        assert rel(grad, unpatched[2][name]) <= tol, name


def test_cpu_f32():
    layer = tiny_layer()
    compare(layer, torch.randn(2, 50, 64), 1e-4)


@pytest.mark.skipif(not (torch.cuda.is_available() and gdn.has_cuda), reason="needs a CUDA GPU")
def test_cuda_bf16():
    layer = tiny_layer(head_dim=128).cuda().to(torch.bfloat16)
    compare(layer, torch.randn(2, 300, 64, device="cuda", dtype=torch.bfloat16), 2e-2)
