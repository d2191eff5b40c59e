"""What summing the value heads' dq, dk shares in bf16 would cost in accuracy, in numpy, against
float64: the question a fused backward (a block per value head) meets where grad_chunk sums the
shares of a key head's value heads in f32 registers (docs/cuda.md, against FlashQLA).

Two value heads share one key head's q and k. Each head's share of the gradient of the raw rows,
dq_h = r (dq^_h - q^ (q^ . dq^_h)) (the l2norm's backward, linear in the unit row's gradient dq^_h;
q^ = r q), is computed in float64 from the exact recurrence (spec 2), and dk_h likewise. Two ways
to land dq = dq_1 + dq_2 in bf16:
  f32   the sum in f32, rounded to bf16 once (grad_chunk now)
  bf16  each share rounded to bf16 and added onto zero in bf16 (red.add of bf16x2: two value
        heads give the same bits in either order), so rounded twice
Each is compared with the float64 sum (relative Frobenius error); the kernels' other roundings
add about 3e-3 on top (bench/RESULTS.md), independent of these.

  python3 bench/share_rounding.py [T] [seeds]
"""
import sys

import numpy as np

from rounding import D, SCALE, bf16, problem, rel


def unit_rows(x):
    r = 1 / np.sqrt((x * x).sum(1) + 1e-6)
    return x * r[:, None], r


def head_grads(qn, kn, v, g, beta, d_o):
    """dq^, dk^ (the unit rows' gradients) of one value head, exact recurrence in float64:
    S_t = a S + beta k (v - (a S)^T k)^T with a = exp(g), o_t = scale S_t^T q."""
    T = len(g)
    S = np.zeros((D, D))
    states = np.empty((T + 1, D, D))
    states[0] = S
    for t in range(T):
        St = np.exp(g[t]) * S
        u = v[t] - St.T @ kn[t]
        S = St + beta[t] * np.outer(kn[t], u)
        states[t + 1] = S
    dqn = SCALE * np.einsum("tkv,tv->tk", states[1:], d_o)
    dkn = np.zeros_like(kn)
    dS = np.zeros((D, D))
    for t in reversed(range(T)):
        dS = dS + SCALE * np.outer(qn[t], d_o[t])
        St = np.exp(g[t]) * states[t]
        u = v[t] - St.T @ kn[t]
        du = beta[t] * (dS.T @ kn[t])
        dkn[t] = beta[t] * (dS @ u) - St @ du
        dS = np.exp(g[t]) * (dS - np.outer(kn[t], du))
    return dqn, dkn


def raw_share(xn, r, dxn):
    """The l2norm's backward of one share: r (dx^ - x^ (x^ . dx^))."""
    return r[:, None] * (dxn - xn * (xn * dxn).sum(1)[:, None])


def main():
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"T={T}, two value heads a key head, relative error of the sum against float64")
    print(f"{'gates':7} {'seed':>4} {'grad':>4} {'f32 sum':>9} {'bf16 sum':>9} {'ratio':>6}")
    for gates in ("strong", "weak"):
        for seed in range(seeds):
            # Two heads of rounding.py's problem: the first's q and k, each its own v, g, beta, dO.
            heads = [problem(T, gates, 2 * seed + h) for h in range(2)]
            qn, rq = unit_rows(heads[0]["q"].astype(np.float64))
            kn, rk = unit_rows(heads[0]["k"].astype(np.float64))
            shares = []
            for x in heads:
                v, g, beta, d_o = (x[n].astype(np.float64) for n in ("v", "g", "beta", "d_o"))
                dqn, dkn = head_grads(qn, kn, v, g, beta, d_o)
                shares.append((raw_share(qn, rq, dqn), raw_share(kn, rk, dkn)))
            for i, name in enumerate(("dq", "dk")):
                a, b = shares[0][i], shares[1][i]
                exact = a + b
                f32 = bf16(a.astype(np.float32) + b.astype(np.float32))
                two = bf16(bf16(a) + bf16(b))
                ea, eb = rel(f32, exact), rel(two, exact)
                print(f"{gates:7} {seed:>4} {name:>4} {ea:9.3e} {eb:9.3e} {eb / ea:6.2f}")


if __name__ == "__main__":
    main()
