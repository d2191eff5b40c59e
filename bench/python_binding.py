"""What the Python binding adds over the C++ op (bench/bench_cuda.cu's shapes: B=1 HK=16 HV=32
K=V=128 bf16, l2norm): gdn.chunk_gated_delta_rule forward (under no_grad: the inference path)
and forward + backward (autograd: the training path, the forward keeping its intermediates), 20
back-to-back steps per pair of CUDA events after 3 warm-ups, median of 5 pairs, in ms."""

import torch

import gdn


def timed(step, reps=20, pairs=5):
    for _ in range(3):
        step()
    times = []
    for _ in range(pairs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return sorted(times)[pairs // 2]


def main():
    for T in (4096, 16384, 65536):
        dev, bf = "cuda", torch.bfloat16
        q = torch.randn(1, T, 16, 128, device=dev, dtype=bf, requires_grad=True)
        k = torch.randn(1, T, 16, 128, device=dev, dtype=bf, requires_grad=True)
        v = torch.randn(1, T, 32, 128, device=dev, dtype=bf, requires_grad=True)
        g = (-0.001 - 0.5 * torch.rand(1, T, 32, device=dev)).requires_grad_()
        beta = (0.02 + 0.96 * torch.rand(1, T, 32, device=dev)).to(bf).requires_grad_()
        d_o = torch.randn(1, T, 32, 128, device=dev, dtype=bf)

        def forward():
            with torch.no_grad():
                gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)

        def train():  # fresh gradients, as bench_cuda writes them (no accumulation into .grad)
            o, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
            torch.autograd.grad(o, [q, k, v, g, beta], d_o)

        print(f"python gdn B=1 T={T} HK=16 HV=32: fwd {timed(forward):.3f} ms | "
              f"fwd+bwd {timed(train):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
