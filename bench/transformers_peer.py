"""transformers' torch_chunk_gated_delta_rule (the eager PyTorch path of Qwen3-Next and Qwen3.5)
on the shapes of bench_cuda, in the same device call as fla_peer.py.

Same inputs, timing (CUDA events, 3 warm-ups, median of 10, two input sets alternated) and float64
gradient check as fla_peer.py; forward+backward through autograd, with its peak extra memory.
transformers computes in f32 whatever the input dtype and always scales q by K^-0.5.
"""
import sys

import torch

from fla_peer import check_grads, time_shapes


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

    time_shapes("transformers", fn, True)


if __name__ == "__main__":
    sys.exit(main())
