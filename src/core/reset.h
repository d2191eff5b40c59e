#pragma once
// Full resets (spec 2 and 3, "Resets"): a token whose log decay g is at or below -kResetLogDecay,
// g = -inf included, forgets the state entering it. Shared by the CPU and the CUDA chunked paths;
// the float64 recurrence needs nothing (exp(-inf) = 0 there).
//
// Why a threshold: the chunked form writes every decay as exp(G_i - G_j), G the chunk-local
// cumulative sum of g. With g = -inf the difference is inf - inf = NaN, and a finite but huge g
// (-1e37) wipes out the digits of the other gates in the sum. So the paths keep G in two parts:
// H, the cumulative sum of the g that are not resets (G itself without resets), and R, the
// resets so far in the chunk. A decay across a reset (R_i != R_j), exp(G_i) after one (R_i > 0),
// exp(G_last - G_i) before the chunk's last one and exp(G_last) after any are exactly 0; the
// others come from H alone, as accurate as without resets.
//
// Why this is exact, not an approximation: the threshold's exp(-128) ~ 2.6e-56 is 0 in float32
// (whose smallest subnormal is 1.4e-45 = exp(-103.3)), and so is every decay across a reset (it
// is that factor times others <= 1). The paths compute the float32 value of every factor, as
// they do for ordinary gates. The gradient of a reset's g is 0 (the derivative of the clamp
// max(g, -128) below it; the recurrence's is exp(g) times finite terms): the CPU path writes 0,
// and stops dg's reverse sum at a reset, since the terms past it sum to 0 exactly.
//
// Where one float must carry G (the CUDA gradient kernel reads G, not H and R), G = H - 128 R:
// its decays across a reset are exp(<= -128) = 0 in float32, and G_i - G_j within a segment is
// H_i - H_j up to one rounding of each G at the magnitude 128 R, an exponent (so relative)
// error of at most 2^-16 with one reset in the chunk and 2^-10 with 63: a quarter of one bf16
// rounding (2^-8) of the operands those decays multiply at worst, 2^-8 of one with one reset.
namespace gdn::core {

inline constexpr float kResetLogDecay = 128.0f;

// False for NaN: a NaN gate is not a reset and propagates (spec 7).
constexpr bool is_reset(float g) {
  return g <= -kResetLogDecay;
}

}  // namespace gdn::core
