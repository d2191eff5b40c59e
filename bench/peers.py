"""gdn and its peers on one GPU, in one device call: speed by CUDA-graph replay and accuracy
against a float64 reference, on the same inputs.

    python3 bench/peers.py                 # every peer, each in its own process; a table last
    python3 bench/peers.py --peers gdn,fla --part speed   # some peers, one part
    python3 bench/peers.py --part speed --shapes 1x65536x1x2   # some speed rows (BxTxHKxHV;
                                           # 1xTxHKxHVxN: T packed as N sequences, varlen)
    python3 bench/peers.py --part speed --gates long   # the speed rows with long-memory gates
    python3 bench/peers.py --peer fla      # one peer's speed in this process (gdn, fla,
                                           # flashqla, flashqla-nocp, transformers)
    bash bench/gpu_peers.sh --part speed   # on the GPU machine: the carried wheels installed
                                           # first, the peers' kernel caches kept
    python3 bench/peers.py --peer flashqla --part profile   # one forward + backward at B=1
                                           # T=65536 HK=16 HV=32 between cudaProfilerStart and
                                           # Stop, for ncu --profile-from-start off

The peers (fla-core 0.6.0, flash-qla 0.1.3, tilelang 0.1.15, apache-tvm-ffi 0.1.12,
torch-c-dlpack-ext 0.1.5, z3-solver 4.15.4.0) and gdn's wheel are installed here with Python 3.12
and packed into .peers/site.txz by bench/peers_stage.sh; bench/gpu_peers.sh unpacks it there.

Speed: forward, and forward + backward (torch.autograd.grad of o), each captured once in a CUDA
graph and replayed 20 times per event pair, median of 5 pairs, so Python and launch overhead drop
out (a peer whose call cannot be captured is timed by 20 back-to-back calls per event pair, and
the table says so). bf16 q, k, v, beta; f32 g; l2norm in the kernel. FLA runs its own Triton
kernels (FLA_DISABLE_BACKEND_DISPATCH=1: FLA 0.6 otherwise hands the call to FlashQLA), FlashQLA
its defaults (auto_cp: its intra-GPU context parallelism) and, as flashqla-nocp, its kernels
without that (auto_cp=False), transformers its torch loop with flash-linear-attention hidden
from it.

Accuracy: relative Frobenius error of o, the final state and every gradient against gdn's float64
CPU recurrence (itself tested against a torch float64 loop), HK=1 HV=2, T = 4k and 64k, strong,
weak and mixed gates, an initial state and a gradient of the final state; plus an edge case
(T=4k, three packed sequences, g down to -8, beta in {0, 1}). The driver makes the inputs and the
reference (gdn processes on the CPU, one per case, after the timings, which have the machine to
themselves: the peers' first calls compile their kernels) and every peer reads them from --work.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

SPEED_SHAPES = [(1, 4096, 16, 32), (1, 16384, 16, 32), (1, 65536, 16, 32), (8, 8192, 16, 32),
                (1, 65536, 1, 2)]
ACCURACY_CASES = [(T, gates) for T in (4096, 65536) for gates in ("strong", "weak", "mixed")]
PEERS = ("gdn", "fla", "flashqla", "flashqla-nocp", "transformers")
OUTPUTS = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")


def load(peer):
    """The peer's chunk_gated_delta_rule with FLA's keyword arguments."""
    if peer == "gdn":
        import gdn
        return gdn.chunk_gated_delta_rule
    if peer == "fla":
        os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        import fla.ops.common.chunk_o as chunk_o
        if not chunk_o.TRITON_ABOVE_3_7_1:
            # FLA refuses its gated backward on Hopper with Triton < 3.7.1 (its issue #640); the
            # guard is switched off and the accuracy part reports what the gradients are then.
            chunk_o.TRITON_ABOVE_3_7_1 = True
            print(f"fla: Triton {__import__('triton').__version__} < 3.7.1, backward guard "
                  "switched off (see the accuracy rows)", flush=True)
        return chunk_gated_delta_rule
    if peer == "flashqla":
        import flash_qla
        return flash_qla.chunk_gated_delta_rule
    if peer == "flashqla-nocp":  # its kernels alone, without its intra-GPU CP (auto_cp)
        import functools
        import flash_qla
        return functools.partial(flash_qla.chunk_gated_delta_rule, auto_cp=False)
    if peer == "transformers":
        sys.modules["fla"] = None  # transformers would dispatch to FLA when it imports
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
        fn = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)

        def call(q, k, v, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None,
                 use_qk_l2norm_in_kernel=False):
            if cu_seqlens is not None:
                raise NotImplementedError("transformers' torch loop has no cu_seqlens")
            group = v.shape[2] // q.shape[2]  # the layer repeats q, k to the value heads first
            q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
            return fn(q, k, v, g=g, beta=beta, initial_state=initial_state,
                      output_final_state=output_final_state,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        return call
    raise SystemExit(f"unknown peer {peer}")


def gates(kind, shape, gen):
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind == "strong":
        return -(0.1 + 2.0 * u)
    if kind == "weak":
        return -(1e-4 + 0.01 * u)
    if kind == "long":  # long memory: a decay of e^-10 takes 20k tokens on average, 10k at least
        return -(1e-5 + 1e-3 * u)
    if kind == "mixed":  # per head: half the heads strong, half weak
        g = -(1e-4 + 0.01 * u)
        g[..., ::2] = -(0.1 + 2.0 * u[..., ::2])
        return g
    if kind == "edge":
        return -8.0 * u
    raise ValueError(kind)


def problem(B, T, HK, HV, kind="mixed", seed=0, edge=False):
    """CPU float64 inputs (bf16-representable where the GPU gets bf16)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    bf = lambda x: x.to(torch.bfloat16).double()  # noqa: E731
    q, k, v = bf(r(B, T, HK, 128)), bf(r(B, T, HK, 128)), bf(r(B, T, HV, 128))
    g = gates("edge" if edge else kind, (B, T, HV), gen).float().double()
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    if edge:
        beta = (beta > 0.5).double()
    beta = bf(beta)
    cu = torch.tensor([0, 1000, 2999, T], dtype=torch.int64) if edge else None
    n = 3 if edge else B
    h0 = 0.1 * r(n, HV, 128, 128)
    d_o, d_ht = bf(r(B, T, HV, 128)), 0.1 * r(n, HV, 128, 128)
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu=cu, d_o=d_o, d_ht=d_ht)


def reference_cases():
    cases = {f"T{T}-{kind}": (T, kind, False) for T, kind in ACCURACY_CASES}
    cases["T4096-edge-varlen"] = (4096, "edge", True)
    return cases


def make_reference(work, name):
    """One case's inputs and float64 results, saved for every peer to read."""
    import gdn
    T, kind, edge = reference_cases()[name]
    p = problem(1, T, 1, 2, kind, edge=edge)
    leaves = [p[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "h0")]
    o, ht = gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5],
                                       output_final_state=True, cu_seqlens=p["cu"],
                                       use_qk_l2norm_in_kernel=True)
    torch.autograd.backward([o, ht], [p["d_o"], p["d_ht"]])
    p["ref"] = [o.detach(), ht.detach()] + [x.grad for x in leaves]
    os.makedirs(work, exist_ok=True)
    torch.save(p, os.path.join(work, f"{name}.pt.part"))
    os.replace(os.path.join(work, f"{name}.pt.part"), os.path.join(work, f"{name}.pt"))


def accuracy(fn, work):
    rows = []
    for name in sorted(reference_cases()):
        p = torch.load(os.path.join(work, f"{name}.pt"))
        dev = {n: (None if p[n] is None else p[n].cuda()) for n in p if n != "ref"}
        lowp = lambda x: x.to(torch.bfloat16)  # noqa: E731
        leaves = [lowp(dev["q"]), lowp(dev["k"]), lowp(dev["v"]), dev["g"].float(),
                  lowp(dev["beta"]), dev["h0"].float()]
        leaves = [x.requires_grad_() for x in leaves]
        try:
            o, ht = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                       cu_seqlens=dev["cu"], use_qk_l2norm_in_kernel=True)
            grads = torch.autograd.grad([o, ht], leaves, [lowp(dev["d_o"]), dev["d_ht"].float()])
        except Exception as e:  # noqa: BLE001 (a peer that cannot run a case says why)
            rows.append((name, f"n/a ({type(e).__name__}: {str(e)[:80]})"))
            continue
        got = [o, ht] + list(grads)
        errs = [((a.double().cpu() - b).norm() / b.norm()).item() for a, b in zip(got, p["ref"])]
        rows.append((name, " ".join(f"{n} {e:.3e}" for n, e in zip(OUTPUTS, errs))))
    return rows


def replay_ms(body):
    """ms per call: body captured in a CUDA graph, replayed 20 times per event pair, median of 5
    pairs; or 20 back-to-back calls per pair when capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph, how = torch.cuda.CUDAGraph(), "graph"
    try:
        with torch.cuda.graph(graph):
            body()
        run = graph.replay
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()
        graph, run, how = None, body, "calls"
    times = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 20)
    return statistics.median(times), how


def timing_inputs(B, T, HK, HV, kind="mixed"):
    """q, k, v, g, beta (leaves) and d_o on the GPU, as the timings take them."""
    p = problem(B, T, HK, HV, kind, seed=1)
    q, k, v = (p[n].cuda().bfloat16().requires_grad_() for n in ("q", "k", "v"))
    g = p["g"].cuda().float().requires_grad_()
    beta = p["beta"].cuda().bfloat16().requires_grad_()
    return q, k, v, g, beta, p["d_o"].cuda().bfloat16()


def speed(fn, max_tokens, shapes, kind):
    rows = []
    for shape in shapes:
        B, T, HK, HV = shape[:4]
        N = shape[4] if len(shape) > 4 else 0  # varlen: T cut into N sequences of about equal length
        if B * T > max_tokens:
            continue
        q, k, v, g, beta, d_o = timing_inputs(B, T, HK, HV, kind)
        cu = (torch.tensor([n * T // N for n in range(N + 1)], dtype=torch.int64, device="cuda")
              if N else None)
        forward = lambda: fn(q, k, v, g, beta, cu_seqlens=cu,  # noqa: E731
                             use_qk_l2norm_in_kernel=True)

        def both():
            o, _ = forward()
            torch.autograd.grad(o, (q, k, v, g, beta), d_o)

        try:
            with torch.no_grad():
                fwd, how_f = replay_ms(forward)
            fb, how_b = replay_ms(both)
        except NotImplementedError:  # a peer without cu_seqlens (transformers' loop)
            continue
        how = how_f if how_f == how_b else f"{how_f}/{how_b}"
        rows.append((f"B={B} T={T} HK={HK} HV={HV}" + (f" {N} sequences" if N else "") +
                      ("" if kind == "mixed" else f" {kind} gates"), fwd, fb, how))
        del q, k, v, g, beta, d_o
        torch.cuda.empty_cache()
    return rows


def profile(fn, kind, B=1, T=65536, HK=16, HV=32):
    """Three forward + backward calls (the peer's compilation and autotuning), then one between
    cudaProfilerStart and cudaProfilerStop: ncu --profile-from-start off sees that one only."""
    q, k, v, g, beta, d_o = timing_inputs(B, T, HK, HV, kind)

    def both():
        o, _ = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        torch.autograd.grad(o, (q, k, v, g, beta), d_o)

    for _ in range(3):
        both()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    both()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profile: one forward + backward at B={B} T={T} HK={HK} HV={HV}, {kind} gates",
          flush=True)


def run_peer(peer, part, work, shapes, kind):
    fn = load(peer)
    if part == "profile":
        profile(fn, kind)
    elif part == "speed":
        print(f"== {peer} ({torch.cuda.get_device_name()}, torch {torch.__version__})", flush=True)
        # transformers' torch loop is timed where it takes seconds, not minutes
        for shape, fwd, fb, how in speed(fn, 16384 if peer == "transformers" else 1 << 30,
                                         shapes, kind):
            print(f"speed {peer} {shape}: fwd {fwd:.3f} ms, fwd+bwd {fb:.3f} ms ({how})",
                  flush=True)
    else:
        for name, line in accuracy(fn, work):
            print(f"accuracy {peer} {name}: {line}", flush=True)


def format_shapes(shapes):
    """[(1, 65536, 1, 2), (1, 65536, 16, 32, 1024)] -> "1x65536x1x2,1x65536x16x32x1024"
    (parse_shapes' input)."""
    return ",".join("x".join(map(str, shape)) for shape in shapes)


def parse_shapes(text):
    """"1x65536x1x2,1x65536x16x32x1024" -> [(1, 65536, 1, 2), (1, 65536, 16, 32, 1024)]: BxTxHKxHV,
    or 1xTxHKxHVxN for T packed as N sequences."""
    shapes = []
    for item in text.split(","):
        sizes = item.split("x")
        if len(sizes) not in (4, 5) or not all(x.isdigit() and int(x) > 0 for x in sizes):
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: expected BxTxHKxHV or 1xTxHKxHVxN, positive")
        shape = tuple(map(int, sizes))
        B, T, HK, HV = shape[:4]
        if HV % HK:
            raise argparse.ArgumentTypeError(f"shape {item!r}: HK={HK} must divide HV={HV}")
        if len(shape) == 5 and (B != 1 or shape[4] > T):
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: N={shape[4]} sequences need B=1 and N <= T={T}")
        shapes.append(shape)
    return shapes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", choices=PEERS)
    parser.add_argument("--part", choices=("speed", "accuracy", "both", "profile"),
                        default="both",
                        help="with --peer: that peer's part (default speed; profile: one call "
                             "for ncu); the driver: which parts for every peer (default both)")
    parser.add_argument("--work", default="/tmp/gdn_peers")
    parser.add_argument("--make-reference", metavar="CASE", choices=sorted(reference_cases()))
    parser.add_argument("--peers", default="gdn,fla,flashqla,transformers",
                        help="the driver's peers, comma-separated (default: all but "
                        "flashqla-nocp, whose kernels TileLang compiles apart)")
    parser.add_argument("--shapes", type=parse_shapes, default=SPEED_SHAPES,
                        help="the speed part's shapes, BxTxHKxHV or 1xTxHKxHVxN (T as N "
                        "sequences) comma-separated (default: "
                        + format_shapes(SPEED_SHAPES) + ")")
    parser.add_argument("--gates", choices=("strong", "weak", "mixed", "long"), default="mixed",
                        help="the speed and profile parts' gates (default mixed: half the heads "
                        "strong, half weak; long: a decay of e^-10 takes 20k tokens on average, "
                        "10k at least, so that FlashQLA's intra-GPU CP cannot start a segment "
                        "from its last chunks)")
    args = parser.parse_args()
    if args.make_reference:
        return make_reference(args.work, args.make_reference)
    if args.peer:
        part = args.part if args.part in ("accuracy", "profile") else "speed"
        return run_peer(args.peer, part, args.work, args.shapes, args.gates)
    if args.part == "profile":
        raise SystemExit("--part profile needs --peer")
    me = [sys.executable, os.path.abspath(__file__), "--work", args.work, "--shapes",
          format_shapes(args.shapes), "--gates", args.gates]
    lines, start = [], time.monotonic()

    def run(peer, part):  # the peer's lines as they come, so that a time limit keeps them
        child = subprocess.Popen(me + ["--peer", peer, "--part", part], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        tail = []
        for line in child.stdout:
            sys.stdout.write(f"[{time.monotonic() - start:6.0f} s] {line}")
            sys.stdout.flush()
            tail = (tail + [line])[-20:]
            if line.startswith(("speed", "acc")):
                lines.append(line.rstrip())
        if child.wait():
            lines.append(f"{peer} {part}: exited with {child.returncode}: {tail[-1].strip()}")

    peers = args.peers.split(",")
    if args.part in ("speed", "both"):  # alone on the machine: compilers and timings
        for peer in peers:
            run(peer, "speed")
    if args.part in ("accuracy", "both"):
        env = dict(os.environ, OMP_NUM_THREADS="2")
        references = [subprocess.Popen(me + ["--make-reference", name], env=env)
                      for name in reference_cases()]
        if any(r.wait() for r in references):
            raise SystemExit("a reference failed")
        for peer in peers:
            run(peer, "accuracy")
    print("\n".join(["", "== summary"] + lines + accuracy_against_peers(lines)))


def accuracy_against_peers(lines):
    """gdn's error beside the best other peer's, per case and output, from the accuracy lines
    ("accuracy PEER CASE: o 3.3e-03 final_state ..."); a row names the outputs where gdn is above."""
    errors = {}  # (case, output) -> {peer: error}
    for line in lines:
        if not line.startswith("accuracy ") or " n/a " in line:
            continue
        head, values = line.split(": ", 1)
        _, peer, case = head.split()
        fields = values.split()
        for name, value in zip(fields[::2], fields[1::2]):
            errors.setdefault((case, name), {})[peer] = float(value)
    rows = []
    for case in sorted({c for c, _ in errors}):
        cells, above = [], []
        for name in OUTPUTS:
            by_peer = errors.get((case, name), {})
            others = {p: e for p, e in by_peer.items() if p != "gdn"}
            if "gdn" not in by_peer or not others:
                continue
            best = min(others, key=others.get)
            cells.append(f"{name} {by_peer['gdn']:.3e}/{others[best]:.3e} {best}")
            if by_peer["gdn"] > others[best]:
                above.append(name)
        if cells:
            rows.append(f"gdn / best peer {case}: " + ", ".join(cells) +
                        (f"; above: {' '.join(above)}" if above else "; at or below on all"))
    return ["", "== gdn against the best peer"] + rows if rows else []


if __name__ == "__main__":
    sys.exit(main())
