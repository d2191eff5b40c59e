#!/usr/bin/env python3
"""gdn's CPU op against ggml's GATED_DELTA_NET, side by side on this machine.

Gets ggml at a pinned commit (cloned from its public repository, or from a local clone given
with --ggml / GGML_DIR), adds to its test-backend-ops the perf cases of Qwen3.5's shapes
(H_k=16 heads of 128, v_repeat=2, T tokens; ggml's own perf cases stop at T=1024 without GQA),
builds it for this CPU (GGML_NATIVE, CPU backend only), then alternates rounds of

  ggml: test-backend-ops perf -o GATED_DELTA_NET -b CPU -p <the case>   (its threads: all cores)
  gdn:  bench_cpu forward / forward_backward at the same T                (OMP_NUM_THREADS)

and prints min / median / max tokens/s over the rounds. ggml's graph is l2_norm(q), l2_norm(k),
then the op repeated ~20 times: its figure is the op alone (the l2 norms run once per graph).
gdn's forward with l2norm does it inside the op, every call.

  bench/ggml_peer.py --gdn-build build [--ggml PATH] [--rounds 3] [-T 2048 8192]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

GGML_URL = "https://github.com/ggml-org/ggml.git"
GGML_COMMIT = "d99724f2b141fed9e1a9f402213506c081433465"  # readme : update ... (#1599)
MARKER = "// gdn peer cases"
ANCHOR = "// PP: n_seq_tokens=64,256 (prompt processing)"


def run(cmd, **kw):
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def get_ggml(args, src: Path):
    if not src.exists():
        run(["git", "clone", "--quiet", args.ggml or GGML_URL, src])
    run(["git", "-C", src, "checkout", "--quiet", "--force", args.commit])
    tests = src / "tests" / "test-backend-ops.cpp"
    text = tests.read_text()
    if MARKER not in text:
        if ANCHOR not in text:
            sys.exit(f"{tests}: the line '{ANCHOR}' is gone; add the perf cases by hand")
        cases = "".join(
            f"    test_cases.emplace_back(new test_gated_delta_net(GGML_TYPE_F32, {args.heads_k}, "
            f"128, {T}, 1, {args.v_repeat}));  {MARKER}\n" for T in args.T)
        text = text.replace(ANCHOR + "\n", ANCHOR + "\n" + cases, 1)
        tests.write_text(text)


def build_ggml(args, src: Path) -> Path:
    build = src / "build"
    run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_NATIVE=ON", "-DGGML_BUILD_TESTS=ON", "-DGGML_BUILD_EXAMPLES=OFF",
         "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_OPENMP=ON"],
        stdout=subprocess.DEVNULL)
    run(["cmake", "--build", build, "--target", "test-backend-ops", f"-j{args.jobs}"],
        stdout=subprocess.DEVNULL)
    return build / "bin" / "test-backend-ops"


def ggml_tokens_per_s(exe: Path, args, T: int) -> float:
    case = (f"head_count={args.heads_k},head_size=128,n_seq_tokens={T},n_seqs=1,"
            f"v_repeat={args.v_repeat},")
    out = run([exe, "perf", "-o", "GATED_DELTA_NET", "-b", "CPU", "-p", case],
              capture_output=True, text=True).stdout
    times = re.findall(r"([0-9.]+) us/run", out)
    if len(times) != 1:
        sys.exit(f"expected one ggml perf line for T={T}, got:\n{out}")
    return T / (float(times[0]) * 1e-6)


def gdn_tokens_per_s(exe: Path, args, T: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = run([exe, f"--benchmark_filter=^forward(_backward)?/T:{T}/bf16:0/",
               f"--benchmark_min_time={args.min_time}", "--benchmark_format=json"],
              capture_output=True, text=True, env=env).stdout
    rows = {}
    for b in json.loads(out)["benchmarks"]:
        kind, l2 = b["name"].split("/")[0], "l2norm:1" in b["name"]
        name = {("forward", True): "gdn fwd, l2norm", ("forward", False): "gdn fwd, no l2norm",
                ("forward_backward", True): "gdn fwd+bwd, l2norm",
                ("forward_backward", False): "gdn fwd+bwd, no l2norm"}[kind, l2]
        rows[name] = b["tokens/s"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gdn-build", default="build", help="gdn's build dir (has bench/bench_cpu)")
    ap.add_argument("--ggml", default=os.environ.get("GGML_DIR"),
                    help=f"a local ggml clone to clone from (default: {GGML_URL})")
    ap.add_argument("--commit", default=GGML_COMMIT)
    ap.add_argument("--work", default="/tmp/gdn-ggml-peer", help="where ggml is cloned and built")
    ap.add_argument("-T", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--heads-k", type=int, default=16)
    ap.add_argument("--v-repeat", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="gdn's OpenMP threads")
    ap.add_argument("--min-time", type=float, default=2.0, help="bench_cpu seconds per case")
    ap.add_argument("--jobs", type=int, default=2, help="build jobs")
    args = ap.parse_args()

    src = Path(args.work) / "ggml"
    src.parent.mkdir(parents=True, exist_ok=True)
    get_ggml(args, src)
    ggml = build_ggml(args, src)
    bench = Path(args.gdn_build) / "bench" / "bench_cpu"
    if not bench.exists():
        sys.exit(f"{bench} is missing: build gdn first (cmake --build {args.gdn_build})")
    commit = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()

    runs = {}  # (row, T) -> [tokens/s per round]
    for r in range(args.rounds):
        for T in args.T:
            # ggml first in even rounds, gdn first in odd ones.
            order = ["ggml", "gdn"] if r % 2 == 0 else ["gdn", "ggml"]
            for who in order:
                rows = ({f"ggml fwd ({commit})": ggml_tokens_per_s(ggml, args, T)}
                        if who == "ggml" else gdn_tokens_per_s(bench, args, T))
                for name, v in rows.items():
                    runs.setdefault((name, T), []).append(v)
                    print(f"round {r + 1} T={T} {name}: {v / 1e3:.2f}k tokens/s", flush=True)

    ggml_name = f"ggml fwd ({commit})"
    print(f"\ntokens/s, min / median / max over {args.rounds} rounds "
          f"(HK={args.heads_k} HV={args.heads_k * args.v_repeat} K=V=128 f32)\n")
    names = sorted({n for n, _ in runs}, key=lambda n: (not n.startswith("ggml"), n))
    print("| T | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for T in args.T:
        cells = []
        for n in names:
            v = runs.get((n, T), [])
            if not v:
                cells.append("")
                continue
            med = statistics.median(v)
            ratio = "" if n == ggml_name else f" ({med / statistics.median(runs[ggml_name, T]):.2f}x)"
            cells.append(f"{min(v) / 1e3:.1f} / {med / 1e3:.1f} / {max(v) / 1e3:.1f}k{ratio}")
        print(f"| {T} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
