"""The CUDA kernels' rounding, emulated in numpy, against float64: which rounding point costs
accuracy, and what a change would gain, before it is written for the GPU. The forward's o and
final state, and the backward's state-gradient chain (dh0; dh0() says its forms).

Every product of the kernels takes bf16 operands and sums in f32; the emulation rounds the same
operands (round to nearest even) and multiplies in f32, so its errors land where the GPU's do
(bench/RESULTS.md compares them). Forms of Vn, per chunk (spec 3):
  bf16-x    Vn = A X,  X = bf16(diag(beta) (V - diag(e) K S))   (the kernels until 2026-12-02)
  ours      the same with X = hi + lo, two bf16 parts (X to ~16 bits), and Vn in two parts where
            P multiplies it for O                                     (the kernels until 2026-12-02)
  split-vs  ours, and Vn in two parts where K^T diag(f) multiplies it for the state too
  unit-rows ours with the unit rows q / |q|, k / |k| not rounded to bf16: the rows q, k as they
            come (bf16) in the products and their l2norm factors applied in f32 (the kernels
            until 2026-12-06)
  unit-x1   unit-rows with X rounded once (ours-x1 of bf16 rows)
  unit-vo1  unit-rows with Vn rounded once where P multiplies it for O (ours-vo1 of bf16 rows);
            unit-vo1/S/unit-x1, its summaries with X rounded once, is the kernels now
  unit-none unit-rows with neither split (bf16-x of unit rows)
  wy        Vn = u - W S,  u = bf16(A diag(beta) V), W = bf16(A diag(beta e) K)
  wy-fla    as wy, with beta V and beta e K rounded to bf16 before A (FLA's recompute_w_u)
  wy-u32    unit-rows' inputs, Vn = U - bf16(W) S with U = bf16(A diag(beta)) V kept in f32 and
            W = bf16(A diag(beta e)) K: A's columns scaled and rounded once, as A is
  wy-w2     wy-u32 with W carried in two bf16 parts
  wy-a      unit-rows' A and inputs, Vn = A diag(beta) V - bf16(A diag(beta e) K) S: the state
            passes' form with W made from A in the pass, rounded once (U, the V term, exact)
  wy-1      wy-a with its operands rounded once:
            Vn = A bf16(diag(beta) V) - bf16(bf16(A diag(beta e)) K) S
and any form cut into segments joined by f32 affine summaries (fold.cu), FORM/SEGMENTS on the
command line, whose summaries (offsets and transfers) may take a form of their own:
FORM/SEGMENTS/SUMMARY_FORM (unit-rows/4/wy-1: bench/variants/wy-summary.patch). A is
bf16((I + L)^-1) computed in float64 for every form, P = bf16(scale Q K^T * decay).

  python3 bench/rounding.py [T] [segments] [form[/segments[/summary form]],...] [backward forms,
      likewise]   (numpy)
"""
import sys

import numpy as np

C, D = 64, 128
FORMS = ("bf16-x", "ours", "ours-x1", "ours-vo1", "split-vs", "wy", "wy-fla", "wy-u32", "wy-w2",
         "wy-a", "wy-1")
UNIT_ROWS = ("unit-rows", "unit-x1", "unit-vo1", "unit-none", "unit-sdo1", "wy-u32", "wy-w2",
             "wy-a", "wy-1", "wy-w", "wy-w1")
SCALE = 1 / np.sqrt(D)


def identity(x):
    return x


def bf16(x):
    """x rounded to bf16 (nearest even), as f32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def problem(T, gates, seed):
    """bench/peers.py's accuracy inputs for one value head: bf16 q k v beta dO, f32 g, f64 h0
    and d_ht."""
    rng = np.random.default_rng(seed)
    q, k, v = (bf16(rng.standard_normal((T, D))) for _ in range(3))
    u = rng.random(T)
    g = {"strong": -(0.1 + 2.0 * u), "weak": -(1e-4 + 0.01 * u)}[gates].astype(np.float32)
    return dict(q=q, k=k, v=v, g=g, beta=bf16(rng.random(T)), h0=0.1 * rng.standard_normal((D, D)),
                d_o=bf16(rng.standard_normal((T, D))), d_ht=0.1 * rng.standard_normal((D, D)))


class Chunk:
    """chunk_prep's outputs for one chunk: the gates, A and P (rounded when low)."""

    def __init__(self, qn, kn, v, g, beta, dt, low):
        G = np.cumsum(g.astype(dt)).astype(dt)
        decay = np.tril(np.exp(G[:, None] - G[None, :]))
        self.q, self.k, self.v, self.beta = qn, kn, v.astype(dt), beta.astype(dt)
        self.e, self.f, self.gamma = np.exp(G), np.exp(G[-1] - G), np.exp(G[-1])
        L = np.tril(self.beta[:, None] * (kn @ kn.T) * decay, -1)
        self.A64 = np.linalg.inv(np.eye(C) + L.astype(np.float64))
        self.A = self.A64.astype(dt)
        self.P = SCALE * (qn @ kn.T) * decay
        if low:
            self.A, self.P = bf16(self.A), bf16(self.P)


def chunks(p, form, low):
    """The chunks of p, from q, k over their l2 norms (spec 1), rounded to bf16 when low unless
    form is one of UNIT_ROWS."""
    dt = np.float32 if low else np.float64
    r = bf16 if low and form not in UNIT_ROWS else identity
    qn, kn = (r(x / np.sqrt((x * x).sum(1, keepdims=True) + 1e-6))
              for x in (p["q"].astype(dt), p["k"].astype(dt)))
    return [Chunk(qn[a:a + C], kn[a:a + C], p["v"][a:a + C], p["g"][a:a + C],
                  p["beta"][a:a + C], dt, low) for a in range(0, len(p["g"]), C)]


def step(S, ch, form, low, v=None):
    """One chunk from state S: the state leaving it and the chunk's output O."""
    r = bf16 if low else identity
    V = ch.v if v is None else v
    b, e, Sb = ch.beta[:, None], ch.e[:, None], r(S)
    exact = identity  # a value carried in two bf16 parts
    if form in ("bf16-x", "ours", "ours-x1", "ours-vo1", "split-vs"):
        X = b * (V - e * (ch.k @ Sb))
        Vn = ch.A @ (r(X) if form in ("bf16-x", "ours-x1") else X)
    elif form == "wy-a":
        # ours with diag(beta e) K S taken apart: W = A diag(beta e) K rounded once; U exact.
        Vn = ch.A @ (b * V) - r(ch.A @ (b * e * ch.k)) @ Sb
    elif form == "wy-1":
        # wy-a with the operands rounded once: A bf16(diag(beta) V), bf16(A diag(beta e)) K.
        Vn = ch.A @ r(b * V) - r(r(ch.A * (ch.beta * ch.e)[None, :]) @ ch.k) @ Sb
    elif form in ("wy-u32", "wy-w2"):
        # A's columns scaled in chunk_prep and rounded once, as A is now; U stays f32.
        U = r(ch.A64 * ch.beta[None, :]) @ V
        W = r(ch.A64 * (ch.beta * ch.e)[None, :]) @ ch.k
        Vn = U - (r(W) if form == "wy-u32" else W) @ Sb
    else:
        pre = r if form == "wy-fla" else exact
        Vn = r(ch.A @ pre(b * V)) - r(ch.A @ pre(b * e * ch.k)) @ Sb
    vo = r if form in ("bf16-x", "ours-vo1", "wy", "wy-fla") else exact  # Vn where P meets it
    O = (SCALE * e) * (ch.q @ Sb) + ch.P @ vo(Vn)
    return ch.gamma * S + ch.k.T @ (exact if form == "split-vs" else r)(ch.f[:, None] * Vn), O


def cut(items, segments):
    """items in `segments` consecutive parts of equal length (the last shorter), as segments.h."""
    per = -(-len(items) // segments)
    return [items[s * per:(s + 1) * per] for s in range(segments)]


def transfer(part, form, low):
    """The transfer M of a segment's chunks: the state pass from the identity with V = 0."""
    M = np.eye(D, dtype=np.float32 if low else np.float64)
    for ch in part:
        M, _ = step(M, ch, form, low, v=np.zeros_like(ch.v))
    return M


def forward(p, form="ours", segments=1, low=True, summary=None):
    """o and the final state; low=False is the float64 reference (no rounding). The segments'
    summaries take the form `summary` (default: form), of the same inputs (UNIT_ROWS or not)."""
    dt = np.float32 if low else np.float64
    r = bf16 if low else identity
    all_chunks = chunks(p, form, low)
    summary = summary or form
    assert (summary in UNIT_ROWS) == (form in UNIT_ROWS), (form, summary)
    kernel_form = {"unit-rows": "ours", "unit-x1": "ours-x1", "unit-vo1": "ours-vo1",
                   "unit-none": "bf16-x"}
    form, summary = (kernel_form.get(f, f) for f in (form, summary))
    assert form in FORMS and summary in FORMS, (form, summary)
    parts = cut(all_chunks, segments)
    # The state entering each segment: segment 0 from h0, then S_k+1 = M_k S_k + N_k with the
    # transfer M_k and offset N_k (from zero) in f32.
    entering = [p["h0"].astype(dt)]
    for s, part in enumerate(parts[:-1]):
        S = entering[0] if s == 0 else np.zeros((D, D), dt)
        for ch in part:
            S, _ = step(S, ch, summary, low)
        if s > 0:
            S = (transfer(part, summary, low) @ entering[-1] + S).astype(dt)
        entering.append(S)
    o = []
    for s, part in enumerate(parts):
        S = entering[s]
        for ch in part:
            S, O = step(S, ch, form, low)
            o.append(r(O))
    return np.concatenate(o), S


def dh0(p, form="ours", low=True, segments=1, summary=None):
    """The state gradient's reverse chain (state_backward.cu) from d_ht and dO: dh0, and dh (the
    gradient of the state leaving each chunk, which grad_chunk reads), stacked. Per chunk,
    dVn = diag(f) K dS + P^T dO, Y = A^T dVn, dS <- gamma dS + Q^T diag(scale e) dO -
    K^T diag(beta e) Y; the kernels round dS, dVn (before A) and diag(beta e) Y (before K) to bf16
    and carry diag(scale e) dO as hi + lo parts (`ours`; bf16-sdo rounds it once, as the kernels
    did until 2026-12-02); split-dvn and split-y carry dVn or Y in two parts too, split-both both;
    unit-rows is ours with the unit rows of q, k not rounded (as forward()), unit-sdo1 the same
    with diag(scale e) dO rounded once; wy-w is unit-rows with Y and its product by K replaced by
    W^T dVn, W = A diag(beta e) K made in the pass (its operand A diag(beta e) in two parts) and
    rounded once; wy-w1 rounds that operand once too. Cut into segments as the kernels cut it:
    the backward's summary (form `summary`, default form) runs the last segment from d_ht and the
    middle ones from zero (D_k), and the gradient entering each segment's end is M_k+1^T times the
    one after plus D_k+1 in f32, M_k the forward summary's transfer (forward()'s form `ours`)."""
    dt = np.float32 if low else np.float64
    r = bf16 if low else identity
    summary = summary or form
    assert (summary in UNIT_ROWS) == (form in UNIT_ROWS), (form, summary)

    def chain(dS, part, form, dh=None):
        r_dvn = identity if form in ("split-dvn", "split-both") else r
        r_y = identity if form in ("split-y", "split-both") else r
        r_sdo = r if form in ("bf16-sdo", "unit-sdo1") else identity
        for a, ch in reversed(part):
            if dh is not None:
                dh.append(dS)
            dO = p["d_o"][a:a + C].astype(dt)
            dVn = ch.f[:, None] * (ch.k @ r(dS)) + ch.P.T @ dO
            if form in ("wy-w", "wy-w1"):  # W^T dVn, W = A diag(beta e) K made in the pass
                AB = ch.A * (ch.beta * ch.e)[None, :]  # its operand, in two parts or rounded
                w_term = r((AB if form == "wy-w" else r(AB)) @ ch.k).T @ r(dVn)
            else:
                w_term = ch.k.T @ r_y(ch.beta[:, None] * ch.e[:, None] * (ch.A.T @ r_dvn(dVn)))
            dS = ch.gamma * dS + ch.q.T @ r_sdo(SCALE * ch.e[:, None] * dO) - w_term
        return dS

    parts = cut(list(zip(range(0, len(p["g"]), C), chunks(p, form, low))), segments)
    leaving = [p["d_ht"].astype(dt)]  # the gradient leaving each segment, the last first
    if segments > 1:
        leaving.append(chain(leaving[0], parts[-1], summary))
        for part in reversed(parts[1:-1]):
            M = transfer([ch for _, ch in part], "ours", low)
            D_k = chain(np.zeros((D, D), dt), part, summary)
            leaving.append((M.T @ leaving[-1] + D_k).astype(dt))
    dh = []
    for part, dS in zip(reversed(parts), leaving):
        dS = chain(dS, part, form, dh)
    return dS, np.stack(dh)


def parse(spec):
    """FORM[/SEGMENTS[/SUMMARY_FORM]] -> (form, segments, summary form or None)."""
    form, *rest = spec.split("/")
    return form, int(rest[0]) if rest else 1, rest[1] if len(rest) > 1 else None


def rel(x, y):
    return np.linalg.norm(x - y) / np.linalg.norm(y)


if __name__ == "__main__":
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    segments = int(sys.argv[2]) if len(sys.argv) > 2 else 34
    forms = sys.argv[3].split(",") if len(sys.argv) > 3 else [
        "bf16-x", "ours", "split-vs", "unit-rows", "wy", "wy-fla", "wy-u32", "wy-w2",
        f"ours/{segments}"]
    print(f"T={T}, relative error vs float64 of o / final state")
    print("gates  seed  " + "  ".join(f.ljust(21) for f in forms))
    for gates in ("strong", "weak"):
        for seed in (0, 1):
            p = problem(T, gates, seed)
            o64, s64 = forward(p, low=False)
            cells = []
            for spec in forms:
                form, seg, summary = parse(spec)
                o, s = forward(p, form, seg, summary=summary)
                cells.append(f"{rel(o, o64):.3e} / {rel(s, s64):.3e}")
            print(f"{gates:6s} {seed:4d}  " + "  ".join(cells), flush=True)
    backward = sys.argv[4].split(",") if len(sys.argv) > 4 else [
        "bf16-sdo", "ours", "split-dvn", "split-y", "split-both", "unit-rows", "unit-sdo1", "wy-w",
        "wy-w1"]
    print(f"T={T}, relative error vs float64 of dh0 / dh (the state gradient's chain)")
    print("gates  seed  " + "  ".join(f.ljust(max(21, len(f))) for f in backward))
    for gates in ("strong", "weak"):
        for seed in (0, 1):
            p = problem(T, gates, seed)
            ref0, ref = dh0(p, low=False)
            cells = []
            for spec in backward:
                form, seg, summary = parse(spec)
                x0, x = dh0(p, form, segments=seg, summary=summary)
                cells.append(f"{rel(x0, ref0):.3e} / {rel(x, ref):.3e}".ljust(max(21, len(spec))))
            print(f"{gates:6s} {seed:4d}  " + "  ".join(cells), flush=True)
