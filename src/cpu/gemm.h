#pragma once
// The chunked passes' dense products and unit-triangular solves, float32, on row-major matrices
// given by pointer and leading dimension (element (i, j) of X at x[i * ldx + j]):
//   gemm<Op::N>: C = A B      or, accumulating, C = beta C + A B      A [m, k]
//   gemm<Op::T>: C = A^T B    or, accumulating, C = beta C + A^T B    A stored [k, m]
// with B [k, n] and C [m, n]; without accumulating, C is not read. A B^T is gemm<Op::N> on a
// transposed copy of B (transpose()).
//
// Why not Eigen's general product: at the op's shapes (m, n, k in {64, 128}) Eigen packs both
// operands into panels on every call and reached about 55% of the FMA peak. Here B's rows are
// read in place (a k x 32 panel, 16 KiB at k = 128, stays in L1 across the row tiles) and A's
// elements are broadcast straight from memory, row-major or transposed alike: no packing.
//
// With AVX-512: 8 x 32 tiles of C in 16 registers, each k step 2 loads of B, 8 broadcasts of A
// and 16 FMAs; masks cover n not a multiple of 32, a shorter tile the last m % 8 rows. Without:
// the same loops in plain C++, which the compiler vectorizes over n. Both sum over k in order
// 0, 1, ..., k - 1, one FMA per term.

#include <algorithm>
#include <cstdint>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace gdn::cpu {

enum class Op { N, T };

namespace gemm_detail {

// Element (i, p) of op(A).
template <Op op>
inline const float* a_at(const float* a, std::int64_t lda, std::int64_t i, std::int64_t p) {
  return op == Op::N ? a + i * lda + p : a + p * lda + i;
}

#if defined(__AVX512F__)
inline __mmask16 lanes(std::int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Rows [0, MR) and columns [0, 16 NV) of C, column block v masked by m[v].
template <Op op, int MR, int NV>
inline void tile(std::int64_t k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 bool accumulate, float beta, float* c, std::int64_t ldc, const __mmask16* m) {
  __m512 acc[MR][NV];  // the loops over i and v unrolled, so that these live in registers
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(m[v], b + p * ldb + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(*a_at<op>(a, lda, i, p));
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      float* at = c + i * ldc + 16 * v;
      if (accumulate)
        acc[i][v] = _mm512_fmadd_ps(scale, _mm512_maskz_loadu_ps(m[v], at), acc[i][v]);
      _mm512_mask_storeu_ps(at, m[v], acc[i][v]);
    }
}

template <Op op, int MR, int NV>
inline void tail_tile(std::int64_t rows, std::int64_t k, const float* a, std::int64_t lda,
                      const float* b, std::int64_t ldb, bool accumulate, float beta, float* c,
                      std::int64_t ldc, const __mmask16* m) {
  if constexpr (MR > 0) {
    if (rows == MR) return tile<op, MR, NV>(k, a, lda, b, ldb, accumulate, beta, c, ldc, m);
    tail_tile<op, MR - 1, NV>(rows, k, a, lda, b, ldb, accumulate, beta, c, ldc, m);
  }
}
#endif

}  // namespace gemm_detail

// Structure that lets gemm skip work: op(A) lower (op(A)[i, p] = 0 for p > i) or upper (0 for
// p < i), where the zeros inside a tile's range of p are read, so must be stored; or only C's
// lower triangle wanted (C = A B only): tiles of C wholly above the diagonal are set to 0, the
// rest computed in full, so C's elements above the diagonal are 0 or their product's value.
enum class Shape { dense, a_lower, a_upper, c_lower };

template <Op op, Shape shape = Shape::dense>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
          const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate,
          float beta = 1.0f) {
  using gemm_detail::a_at;
  // The range [p0, p1) of k that rows [i, i + rows) of op(A) need.
  const auto k_range = [&](std::int64_t i, std::int64_t rows) {
    const std::int64_t p0 = shape == Shape::a_upper ? std::min(i, k) : 0;
    const std::int64_t p1 = shape == Shape::a_lower ? std::min(i + rows, k) : k;
    return std::pair{p0, p1};
  };
#if defined(__AVX512F__)
  constexpr int kRows = 8, kCols = 2;
  for (std::int64_t j = 0; j < n; j += 16 * kCols) {
    __mmask16 mask[kCols];
    for (int v = 0; v < kCols; ++v) mask[v] = gemm_detail::lanes(n - j - 16 * v);
    for (std::int64_t i = 0; i < m; i += kRows) {
      const std::int64_t rows = std::min<std::int64_t>(kRows, m - i);
      float* ct = c + i * ldc + j;
      if (shape == Shape::c_lower && j > i + rows - 1) {
        for (std::int64_t r = 0; r < rows; ++r)
          for (int v = 0; v < kCols; ++v)
            _mm512_mask_storeu_ps(ct + r * ldc + 16 * v, mask[v], _mm512_setzero_ps());
        continue;
      }
      const auto [p0, p1] = k_range(i, rows);
      const float *at = a_at<op>(a, lda, i, p0), *bt = b + p0 * ldb + j;
      if (rows == kRows)
        gemm_detail::tile<op, kRows, kCols>(p1 - p0, at, lda, bt, ldb, accumulate, beta, ct, ldc,
                                            mask);
      else
        gemm_detail::tail_tile<op, kRows - 1, kCols>(rows, p1 - p0, at, lda, bt, ldb, accumulate,
                                                     beta, ct, ldc, mask);
    }
  }
#else
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) row[j] = accumulate ? beta * row[j] : 0.0f;
    const auto [p0, p1] = k_range(i, 1);
    for (std::int64_t p = p0; p < p1; ++p) {
      const float x = *a_at<op>(a, lda, i, p);
      const float* brow = b + p * ldb;
      for (std::int64_t j = 0; j < n; ++j) row[j] += x * brow[j];
    }
  }
#endif
}

// X <- (I + L)^-1 X (Op::N) or (I + L)^-T X (Op::T): L [m, m] strictly lower (its diagonal and
// upper triangle are not read), X [m, n]. Substitution row by row, forward for N and backward for
// T, each row's update kept in registers over 128 columns (8 vectors: 8 FMA chains in flight).
template <Op op>
void solve_unit_lower(std::int64_t m, std::int64_t n, const float* l, std::int64_t ldl, float* x,
                      std::int64_t ldx) {
  // Row i of the substitution reads the rows [j0, j1) of X solved before it, with L's factor at
  // l_at(i, j): op N solves i = 0, 1, .. from j < i; op T solves i = m - 1, .. from j > i.
  const auto step = [&](std::int64_t s, auto&& row_update) {
    const std::int64_t i = op == Op::N ? s : m - 1 - s;
    const std::int64_t j0 = op == Op::N ? 0 : i + 1, j1 = op == Op::N ? i : m;
    row_update(i, j0, j1);
  };
  const auto l_at = [&](std::int64_t i, std::int64_t j) {
    return op == Op::N ? l[i * ldl + j] : l[j * ldl + i];
  };
#if defined(__AVX512F__)
  constexpr int kVectors = 8;
  for (std::int64_t col = 0; col < n; col += 16 * kVectors) {
    __mmask16 mask[kVectors];
    for (int v = 0; v < kVectors; ++v) mask[v] = gemm_detail::lanes(n - col - 16 * v);
    for (std::int64_t s = 0; s < m; ++s)
      step(s, [&](std::int64_t i, std::int64_t j0, std::int64_t j1) {
        float* xi = x + i * ldx + col;
        __m512 acc[kVectors];
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) acc[v] = _mm512_maskz_loadu_ps(mask[v], xi + 16 * v);
        for (std::int64_t j = j0; j < j1; ++j) {
          const __m512 f = _mm512_set1_ps(l_at(i, j));
          const float* xj = x + j * ldx + col;
#pragma GCC unroll 16
          for (int v = 0; v < kVectors; ++v)
            acc[v] = _mm512_fnmadd_ps(f, _mm512_maskz_loadu_ps(mask[v], xj + 16 * v), acc[v]);
        }
#pragma GCC unroll 16
        for (int v = 0; v < kVectors; ++v) _mm512_mask_storeu_ps(xi + 16 * v, mask[v], acc[v]);
      });
  }
#else
  for (std::int64_t s = 0; s < m; ++s)
    step(s, [&](std::int64_t i, std::int64_t j0, std::int64_t j1) {
      float* xi = x + i * ldx;
      for (std::int64_t j = j0; j < j1; ++j) {
        const float f = l_at(i, j);
        const float* xj = x + j * ldx;
        for (std::int64_t col = 0; col < n; ++col) xi[col] -= f * xj[col];
      }
    });
#endif
}

// out [cols, rows] = A^T, A [rows, cols]; leading dimensions lda, ldo.
inline void transpose(std::int64_t rows, std::int64_t cols, const float* a, std::int64_t lda,
                      float* out, std::int64_t ldo) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  // 16 x 16 blocks in registers: pairs of rows interleaved, then 4-lane groups, then 128-bit
  // lanes twice.
  for (; i + 16 <= rows; i += 16) {
    std::int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
      __m512 r[16], t[16];
      for (int x = 0; x < 16; ++x) r[x] = _mm512_loadu_ps(a + (i + x) * lda + j);
      for (int x = 0; x < 16; x += 2) {
        t[x] = _mm512_unpacklo_ps(r[x], r[x + 1]);
        t[x + 1] = _mm512_unpackhi_ps(r[x], r[x + 1]);
      }
      for (int x = 0; x < 16; x += 4) {
        r[x] = _mm512_shuffle_ps(t[x], t[x + 2], 0x44);
        r[x + 1] = _mm512_shuffle_ps(t[x], t[x + 2], 0xEE);
        r[x + 2] = _mm512_shuffle_ps(t[x + 1], t[x + 3], 0x44);
        r[x + 3] = _mm512_shuffle_ps(t[x + 1], t[x + 3], 0xEE);
      }
      for (int x = 0; x < 16; x += 8)
        for (int y = 0; y < 4; ++y) {
          t[x + y] = _mm512_shuffle_f32x4(r[x + y], r[x + y + 4], 0x88);
          t[x + y + 4] = _mm512_shuffle_f32x4(r[x + y], r[x + y + 4], 0xDD);
        }
      for (int y = 0; y < 8; ++y) {
        r[y] = _mm512_shuffle_f32x4(t[y], t[y + 8], 0x88);
        r[y + 8] = _mm512_shuffle_f32x4(t[y], t[y + 8], 0xDD);
      }
      for (int x = 0; x < 16; ++x) _mm512_storeu_ps(out + (j + x) * ldo + i, r[x]);
    }
    for (; j < cols; ++j)
      for (int x = 0; x < 16; ++x) out[j * ldo + i + x] = a[(i + x) * lda + j];
  }
#endif
  for (; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) out[j * ldo + i] = a[i * lda + j];
}

}  // namespace gdn::cpu
