#include "cpu/recurrence.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/layout.h"
#include "cpu/l2norm.h"

namespace gdn::cpu {
namespace {

constexpr std::int64_t kCheckpointStride = 64;  // backward keeps one state per this many tokens

double scale_of(const DeltaRuleInputs& in, const DeltaRuleShape& s) {
  return in.scale != 0 ? in.scale : 1.0 / std::sqrt(static_cast<double>(s.K));
}

// One head's token: inputs in float64, q and k normalized when asked.
struct Token {
  std::vector<double> q, k, v;
  double q_norm = 1, k_norm = 1;  // the l2norm factors r (1 without l2norm)
  double decay = 1, beta = 0;     // exp(g_t), beta_t

  Token(const DeltaRuleShape& s) : q(s.K), k(s.K), v(s.V) {}

  void load(const DeltaRuleInputs& in, const core::Layout& at, const Sequence& seq, std::int64_t t,
            std::int64_t hv) {
    const std::int64_t b = seq.batch, tt = seq.begin + t, hk = at.key_head(hv);
    core::load_row(in.q, at.qk(b, tt, hk), at.s.K, q.data());
    core::load_row(in.k, at.qk(b, tt, hk), at.s.K, k.data());
    core::load_row(in.v, at.v(b, tt, hv), at.s.V, v.data());
    if (in.use_qk_l2norm) {
      q_norm = l2_normalize(q.data(), at.s.K);
      k_norm = l2_normalize(k.data(), at.s.K);
    }
    decay = std::exp(core::load<double>(in.g, at.gate(b, tt, hv)));
    beta = core::load<double>(in.beta, at.gate(b, tt, hv));
  }
};

// S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T. Returns delta (spec 1).
void step(const Token& x, std::int64_t K, std::int64_t V, double* S, double* delta) {
  for (std::int64_t i = 0; i < K * V; ++i) S[i] *= x.decay;
  for (std::int64_t j = 0; j < V; ++j) delta[j] = x.v[j];
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) delta[j] -= S[i * V + j] * x.k[i];
  for (std::int64_t j = 0; j < V; ++j) delta[j] *= x.beta;
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < V; ++j) S[i * V + j] += x.k[i] * delta[j];
}

void load_initial_state(const DeltaRuleInputs& in, const core::Layout& at, std::int64_t n,
                        std::int64_t hv, std::vector<double>& S) {
  if (in.initial_state.given())
    core::load_row(in.initial_state, at.state(n, hv), at.s.K * at.s.V, S.data());
  else
    std::fill(S.begin(), S.end(), 0.0);
}

}  // namespace

void recurrent_forward(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                       const DeltaRuleOutputs& out) {
  const core::Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const double scale = scale_of(in, s);
  const auto tasks = static_cast<std::int64_t>(seqs.size()) * s.HV;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t n = task / s.HV, hv = task % s.HV;
    const Sequence& seq = seqs[static_cast<std::size_t>(n)];
    std::vector<double> S(static_cast<std::size_t>(s.K * s.V)), delta(s.V), o(s.V);
    Token x(s);
    load_initial_state(in, at, n, hv, S);
    for (std::int64_t t = 0; t < seq.length; ++t) {
      x.load(in, at, seq, t, hv);
      step(x, s.K, s.V, S.data(), delta.data());
      std::fill(o.begin(), o.end(), 0.0);  // o = scale S^T q
      for (std::int64_t i = 0; i < s.K; ++i)
        for (std::int64_t j = 0; j < s.V; ++j) o[j] += S[i * s.V + j] * x.q[i];
      for (double& y : o) y *= scale;
      core::store_row(out.o, at.v(seq.batch, seq.begin + t, hv), s.V, o.data());
    }
    if (out.final_state.given())
      core::store_row(out.final_state, at.state(n, hv), s.K * s.V, S.data());
  }
}

// Reverse-mode through the token loop. Per key head (so dq, dk sum over its value heads without
// races); states are checkpointed every kCheckpointStride tokens and recomputed per segment.
void recurrent_backward(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                        const DeltaRuleGrads& gr) {
  const core::Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const double scale = scale_of(in, s);
  const std::int64_t KV = s.K * s.V, group = s.HV / s.HK;
  const auto tasks = static_cast<std::int64_t>(seqs.size()) * s.HK;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t n = task / s.HK, hk = task % s.HK;
    const Sequence& seq = seqs[static_cast<std::size_t>(n)];
    std::vector<double> dq(static_cast<std::size_t>(seq.length * s.K), 0.0), dk(dq.size(), 0.0);
    const std::int64_t segments = (seq.length + kCheckpointStride - 1) / kCheckpointStride;
    std::vector<double> checkpoints(static_cast<std::size_t>(segments * KV));
    std::vector<double> states(static_cast<std::size_t>((kCheckpointStride + 1) * KV));
    std::vector<double> S(static_cast<std::size_t>(KV)), dS(S.size()), delta(s.V), u(s.V),
        d_delta(s.V), du(s.V), dv(s.V), dq_hat(s.K), dk_hat(s.K), d_o(s.V);
    Token x(s);
    for (std::int64_t hv = hk * group; hv < (hk + 1) * group; ++hv) {
      load_initial_state(in, at, n, hv, S);
      for (std::int64_t t = 0; t < seq.length; ++t) {
        if (t % kCheckpointStride == 0)
          std::copy(S.begin(), S.end(), checkpoints.begin() + t / kCheckpointStride * KV);
        x.load(in, at, seq, t, hv);
        step(x, s.K, s.V, S.data(), delta.data());
      }
      if (gr.d_final_state.given())
        core::load_row(gr.d_final_state, at.state(n, hv), KV, dS.data());
      else
        std::fill(dS.begin(), dS.end(), 0.0);

      for (std::int64_t seg = segments - 1; seg >= 0; --seg) {
        const std::int64_t t0 = seg * kCheckpointStride;
        const std::int64_t t1 = std::min(seq.length, t0 + kCheckpointStride);
        // states[i] = state before token t0 + i; states[t1 - t0] = state after the segment.
        std::copy_n(checkpoints.begin() + seg * KV, KV, states.begin());
        for (std::int64_t t = t0; t < t1; ++t) {
          x.load(in, at, seq, t, hv);
          std::copy_n(states.begin() + (t - t0) * KV, KV, states.begin() + (t - t0 + 1) * KV);
          step(x, s.K, s.V, states.data() + (t - t0 + 1) * KV, delta.data());
        }
        for (std::int64_t t = t1 - 1; t >= t0; --t) {
          x.load(in, at, seq, t, hv);
          const double* S_prev = states.data() + (t - t0) * KV;
          const double* S_now = states.data() + (t - t0 + 1) * KV;
          const std::int64_t b = seq.batch, tt = seq.begin + t;
          core::load_row(gr.d_o, at.v(b, tt, hv), s.V, d_o.data());
          // u = S~^T k with S~ = exp(g) S_prev; delta = beta (v - u)
          for (std::int64_t j = 0; j < s.V; ++j) {
            u[j] = 0;
            for (std::int64_t i = 0; i < s.K; ++i) u[j] += x.decay * S_prev[i * s.V + j] * x.k[i];
            delta[j] = x.beta * (x.v[j] - u[j]);
          }
          // o = scale S^T q: dS += scale q dO^T, dq^ = scale S dO
          for (std::int64_t i = 0; i < s.K; ++i) {
            dq_hat[i] = 0;
            for (std::int64_t j = 0; j < s.V; ++j) {
              dS[i * s.V + j] += scale * x.q[i] * d_o[j];
              dq_hat[i] += scale * S_now[i * s.V + j] * d_o[j];
            }
          }
          // S = S~ + k delta^T: dk^ = dS delta, d_delta = dS^T k
          std::fill(d_delta.begin(), d_delta.end(), 0.0);
          for (std::int64_t i = 0; i < s.K; ++i) {
            dk_hat[i] = 0;
            for (std::int64_t j = 0; j < s.V; ++j) {
              dk_hat[i] += dS[i * s.V + j] * delta[j];
              d_delta[j] += dS[i * s.V + j] * x.k[i];
            }
          }
          double dbeta = 0;
          for (std::int64_t j = 0; j < s.V; ++j) {
            dbeta += d_delta[j] * (x.v[j] - u[j]);
            dv[j] = x.beta * d_delta[j];
            du[j] = -x.beta * d_delta[j];
          }
          // u = S~^T k: dk^ += S~ du, dS~ = dS + k du^T; S~ = exp(g) S_prev
          double dg = 0;
          for (std::int64_t i = 0; i < s.K; ++i)
            for (std::int64_t j = 0; j < s.V; ++j) {
              const double s_tilde = x.decay * S_prev[i * s.V + j];
              dk_hat[i] += s_tilde * du[j];
              const double ds_tilde = dS[i * s.V + j] + x.k[i] * du[j];
              dg += s_tilde * ds_tilde;
              dS[i * s.V + j] = x.decay * ds_tilde;
            }
          if (in.use_qk_l2norm) {
            l2_normalize_backward(x.q.data(), x.q_norm, dq_hat.data(), s.K);
            l2_normalize_backward(x.k.data(), x.k_norm, dk_hat.data(), s.K);
          }
          for (std::int64_t i = 0; i < s.K; ++i) {
            dq[static_cast<std::size_t>(t * s.K + i)] += dq_hat[i];
            dk[static_cast<std::size_t>(t * s.K + i)] += dk_hat[i];
          }
          core::store_row(gr.dv, at.v(b, tt, hv), s.V, dv.data());
          core::store(gr.dg, at.gate(b, tt, hv), dg);
          core::store(gr.dbeta, at.gate(b, tt, hv), dbeta);
        }
      }
      if (gr.dh0.given()) core::store_row(gr.dh0, at.state(n, hv), KV, dS.data());
    }
    for (std::int64_t t = 0; t < seq.length; ++t) {
      core::store_row(gr.dq, at.qk(seq.batch, seq.begin + t, hk), s.K, dq.data() + t * s.K);
      core::store_row(gr.dk, at.qk(seq.batch, seq.begin + t, hk), s.K, dk.data() + t * s.K);
    }
  }
}

}  // namespace gdn::cpu
