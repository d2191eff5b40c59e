#pragma once
// The chunked gated delta rule, forward and backward (spec sections 1-3).
//
// Shapes: B batch, T tokens, HK key heads, HV value heads (a multiple of HK; value head h reads
// key head h / (HV / HK)), K key dim, V value dim, N sequences (N = B, or the number of packed
// sequences when cu_seqlens is given with B = 1).

#include <cstdint>

#include "gdn/tensor.h"

namespace gdn {

// Inputs are finite, except that g may be -inf: a full reset, exp(g) = 0, the token forgets the
// state entering it, and its dg is 0 (any g <= -128 acts so on the chunked paths; spec 2, 3). A
// NaN or inf elsewhere, at token t of a sequence, is not checked: as in the recurrence, it makes
// outputs of tokens >= t and the final state non-finite, and in the backward most gradients of
// the sequence; the chunked paths may also make non-finite the outputs of the tokens of t's
// chunk before t (at most chunk_size - 1) and any gradient of that chunk. Earlier chunks' outputs
// and other sequences stay as without it; flash-linear-attention behaves the same (spec 7).
struct DeltaRuleInputs {
  TensorRef q;              // [B, T, HK, K]  f64 / f32 / bf16 / f16
  TensorRef k;              // [B, T, HK, K]  same dtype as q
  TensorRef v;              // [B, T, HV, V]  same dtype as q
  TensorRef g;              // [B, T, HV]     log decay (<= 0; -inf resets), f32 (or q's dtype)
  TensorRef beta;           // [B, T, HV]     write strength in (0, 1), f32 or q's dtype
  TensorRef initial_state;  // [N, HV, K, V]  f32 (or f64), optional: zeros when not given
  TensorRef cu_seqlens;     // [N + 1]        i32 / i64 offsets, optional: packs N sequences, B = 1
  double scale = 0;         // 0 means K^-1/2
  bool use_qk_l2norm = false;  // q, k <- x * rsqrt(sum(x^2) + 1e-6) first
  int chunk_size = 64;         // any positive size; T need not be a multiple
};

struct DeltaRuleOutputs {
  TensorRef o;            // [B, T, HV, V]  any floating dtype
  TensorRef final_state;  // [N, HV, K, V]  f32 (or f64), optional
};

struct DeltaRuleGrads {
  TensorRef d_o;            // in:  [B, T, HV, V]
  TensorRef d_final_state;  // in:  [N, HV, K, V], optional
  TensorRef dq;             // out: [B, T, HK, K]
  TensorRef dk;             // out: [B, T, HK, K]
  TensorRef dv;             // out: [B, T, HV, V]
  TensorRef dg;             // out: [B, T, HV]
  TensorRef dbeta;          // out: [B, T, HV]
  TensorRef dh0;            // out: [N, HV, K, V], given exactly when initial_state is
};

enum class Method {
  chunked,    // float32 compute, chunk by chunk (spec 3), OpenMP over (sequence, value head)
  recurrent,  // float64, token by token (spec 1): the oracle every faster path is tested against
};

struct DeltaRuleShape {
  std::int64_t B, T, HK, HV, K, V, N;
};

// Checks every tensor's rank, shape and dtype; throws gdn::Error naming the argument otherwise.
DeltaRuleShape validate(const DeltaRuleInputs& in);

// The outputs and gradients are written while the inputs are read: none of them may overlap an
// input or another written tensor in memory (gdn::Error naming both otherwise).

void delta_rule_forward(const DeltaRuleInputs& in, const DeltaRuleOutputs& out,
                        Method method = Method::chunked);
void delta_rule_backward(const DeltaRuleInputs& in, const DeltaRuleGrads& grads,
                         Method method = Method::chunked);

}  // namespace gdn
