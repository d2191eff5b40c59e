"""transformers' torch_chunk_gated_delta_rule (the eager PyTorch path of Qwen3-Next and Qwen3.5)
on the shapes of bench_cuda, in the same device call as fla_peer.py.

Same inputs, timing (CUDA events, 3 warm-ups, median of 10, two input sets alternated) and float64
gradient check as fla_peer.py; forward+backward through autograd, with its peak extra memory.
transformers computes in f32 whatever the input dtype and always scales q by K^-0.5.
"""
import sys

import torch

from fla_peer import check_grads, inputs, median_ms


def main():
    import transformers
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_chunk_gated_delta_rule as fn,
    )

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    errors = check_grads(fn)
    print("transformers errors vs float64 at T=512, HK=2, HV=4: " +
          " ".join(f"{n} {e:.2e}" for n, e in errors.items()))

    for B, T in [(1, 4096), (1, 16384), (1, 65536), (8, 8192)]:
        HK, HV = 16, 32
        sets = [inputs(B, T, HK, HV, s) for s in range(2)]
        with torch.no_grad():
            fwd = median_ms(lambda i: fn(*sets[i % 2][:5], use_qk_l2norm_in_kernel=True))
        leaves = [[x.clone().requires_grad_() for x in s[:5]] for s in sets]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

        def step(i):
            o, _ = fn(*leaves[i % 2], use_qk_l2norm_in_kernel=True)
            o.backward(sets[i % 2][5])

        both = median_ms(step)
        peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
        print(f"transformers B={B} T={T} HK={HK} HV={HV}: fwd {fwd:.3f} ms | fwd+bwd {both:.3f} ms "
              f"| peak extra {peak:.2f} GiB", flush=True)
        del sets, leaves


if __name__ == "__main__":
    sys.exit(main())
