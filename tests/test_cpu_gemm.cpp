// The CPU passes' dense products (src/cpu/gemm.h) against a float64 reference on random inputs:
// the op's shapes and odd ones (tails of the 8 x 32 tiles), leading dimensions wider than the
// matrices, C overwritten (never read: NaN there stays out) or accumulated into, A as is and
// transposed, dense or triangular (op(A) lower or upper; only C's lower triangle wanted); the
// unit-triangular solves; the transpose, exactly; and the streamed row stores (stream_rows.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/stream_rows.h"

namespace gdn::cpu {
namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

template <Op op, Shape shape = Shape::dense>
void check(std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate, float beta,
           std::mt19937& rng) {
  const std::int64_t pad = 3;  // leading dimensions wider than the rows
  const std::int64_t a_rows = op == Op::N ? m : k, a_cols = op == Op::N ? k : m;
  const std::int64_t lda = a_cols + pad, ldb = n + pad, ldc = n + pad;
  std::vector<float> a = random_floats(std::size_t(a_rows * lda), rng);
  for (std::int64_t i = 0; i < m; ++i)  // op(A)'s structural zeros, stored
    for (std::int64_t p = 0; p < k; ++p)
      if ((shape == Shape::a_lower && p > i) || (shape == Shape::a_upper && p < i))
        a[std::size_t(op == Op::N ? i * lda + p : p * lda + i)] = 0.0f;
  const std::vector<float> b = random_floats(std::size_t(k * ldb), rng);
  std::vector<float> c = random_floats(std::size_t(m * ldc), rng);
  if (!accumulate) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> c0 = c;
  gemm<op, shape>(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate, beta);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float got = c[std::size_t(i * ldc + j)];
      if (j >= n) {  // the padding is left alone
        EXPECT_TRUE(std::isnan(got) ? std::isnan(c0[std::size_t(i * ldc + j)])
                                    : got == c0[std::size_t(i * ldc + j)]);
        continue;
      }
      double want = accumulate ? double(beta) * c0[std::size_t(i * ldc + j)] : 0.0;
      double bound = std::abs(want);
      for (std::int64_t p = 0; p < k; ++p) {
        const double x = op == Op::N ? a[std::size_t(i * lda + p)] : a[std::size_t(p * lda + i)];
        want += x * b[std::size_t(p * ldb + j)];
        bound += std::abs(x * b[std::size_t(p * ldb + j)]);
      }
      // float32's worst case for k + 1 FMAs in a row, far below the error of one term left out.
      const double tol = 2.0 * double(k + 1) * std::numeric_limits<float>::epsilon() * bound;
      if (shape == Shape::c_lower && j > i && got == 0.0f) continue;  // above: 0 or the product
      ASSERT_NEAR(got, want, tol) << "m=" << m << " n=" << n << " k=" << k
                                  << " accumulate=" << accumulate << " beta=" << beta
                                  << " op=" << (op == Op::N ? "N" : "T") << " shape=" << int(shape)
                                  << " at " << i << "," << j;
    }
}

TEST(CpuGemm, MatchesFloat64) {
  std::mt19937 rng(14);
  const std::int64_t sizes[] = {1, 7, 8, 9, 16, 17, 31, 33, 64, 128};
  for (const std::int64_t m : sizes)
    for (const std::int64_t n : sizes)
      for (const std::int64_t k : {1, 5, 64, 128})
        for (const float beta : {0.0f, 1.0f, 0.75f}) {
          const bool accumulate = beta != 0.0f;
          check<Op::N>(m, n, k, accumulate, beta, rng);
          check<Op::T>(m, n, k, accumulate, beta, rng);
          check<Op::N, Shape::a_lower>(m, n, k, accumulate, beta, rng);
          check<Op::T, Shape::a_lower>(m, n, k, accumulate, beta, rng);
          check<Op::N, Shape::a_upper>(m, n, k, accumulate, beta, rng);
          check<Op::T, Shape::a_upper>(m, n, k, accumulate, beta, rng);
          if (!accumulate) {
            check<Op::N, Shape::c_lower>(m, n, k, accumulate, beta, rng);
            check<Op::T, Shape::c_lower>(m, n, k, accumulate, beta, rng);
          }
        }
}

// (I + L) X = B or (I + L)^T X = B, solved in place, against float64 substitution; L's diagonal
// and upper triangle hold NaN, which must not be read.
TEST(CpuGemm, UnitLowerSolveMatchesFloat64) {
  std::mt19937 rng(16);
  for (const std::int64_t m : {1, 2, 7, 64})
    for (const std::int64_t n : {1, 5, 16, 24, 128, 130})
      for (const Op op : {Op::N, Op::T}) {
        const std::int64_t ldl = m + 1, ldx = n + 2;
        std::vector<float> l = random_floats(std::size_t(m * ldl), rng);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < ldl; ++j) {
            float& x = l[std::size_t(i * ldl + j)];
            x = j >= i ? std::numeric_limits<float>::quiet_NaN() : x * 0.2f;
          }
        std::vector<float> x = random_floats(std::size_t(m * ldx), rng);
        std::vector<double> want(x.begin(), x.end());
        for (std::int64_t s = 0; s < m; ++s) {
          const std::int64_t i = op == Op::N ? s : m - 1 - s;
          for (std::int64_t j = 0; j < m; ++j) {
            const bool before = op == Op::N ? j < i : j > i;
            if (!before) continue;
            const double f =
                op == Op::N ? l[std::size_t(i * ldl + j)] : l[std::size_t(j * ldl + i)];
            for (std::int64_t col = 0; col < n; ++col)
              want[std::size_t(i * ldx + col)] -= f * want[std::size_t(j * ldx + col)];
          }
        }
        if (op == Op::N)
          solve_unit_lower<Op::N>(m, n, l.data(), ldl, x.data(), ldx);
        else
          solve_unit_lower<Op::T>(m, n, l.data(), ldl, x.data(), ldx);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t col = 0; col < ldx; ++col) {
            const std::size_t at = std::size_t(i * ldx + col);
            ASSERT_NEAR(x[at], want[at], 1e-5 * (1 + std::abs(want[at])))
                << "m=" << m << " n=" << n << " op=" << (op == Op::N ? "N" : "T") << " at " << i
                << "," << col;
          }
      }
}

TEST(CpuGemm, TransposeIsExact) {
  std::mt19937 rng(15);
  for (const std::int64_t rows : {1, 15, 16, 17, 33, 64, 128})
    for (const std::int64_t cols : {1, 3, 16, 31, 64, 128}) {
      const std::int64_t lda = cols + 5, ldo = rows + 2;
      const std::vector<float> a = random_floats(std::size_t(rows * lda), rng);
      std::vector<float> out(std::size_t(cols * ldo), -7.0f);
      transpose(rows, cols, a.data(), lda, out.data(), ldo);
      for (std::int64_t j = 0; j < cols; ++j)
        for (std::int64_t i = 0; i < ldo; ++i)
          ASSERT_EQ(out[std::size_t(j * ldo + i)], i < rows ? a[std::size_t(i * lda + j)] : -7.0f)
              << rows << "x" << cols << " at " << j << "," << i;
    }
}

// stream_row writes exactly the row, at every alignment and length (partial lines at both ends,
// whole lines between), and leaves its neighbours alone.
TEST(CpuRows, StreamRowWritesExactlyTheRow) {
  std::mt19937 rng(17);
  const std::vector<float> src = random_floats(200, rng);
  alignas(64) float dst[256];
  for (std::int64_t offset = 0; offset < 16; ++offset)
    for (std::int64_t count : {1, 3, 15, 16, 17, 31, 48, 100, 128, 130}) {
      std::fill(std::begin(dst), std::end(dst), -1.0f);
      const TensorRef t{dst, DType::f32, {256}};
      stream_row(t, offset, count, src.data());
      stream_fence();
      for (std::int64_t i = 0; i < 256; ++i) {
        const bool in_row = i >= offset && i < offset + count;
        ASSERT_EQ(dst[i], in_row ? src[std::size_t(i - offset)] : -1.0f)
            << "offset " << offset << " count " << count << " at " << i;
      }
    }
}

}  // namespace
}  // namespace gdn::cpu
