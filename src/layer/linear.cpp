#include "layer/linear.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>

namespace gdn::layer {
namespace {

template <typename Scalar>
using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Scalar>
using Map = Eigen::Map<Matrix<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename Scalar>
using ConstMap = Eigen::Map<const Matrix<Scalar>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Runs fn(begin, end) on one block of [0, n) per thread, blocks rounded to multiples of `align`.
template <typename Fn>
void split(std::int64_t n, std::int64_t align, Fn fn) {
  const std::int64_t threads = std::max(1, omp_in_parallel() ? 1 : omp_get_max_threads());
  const std::int64_t blocks = (n + align - 1) / align;
  const std::int64_t per = (blocks + threads - 1) / threads * align;
#pragma omp parallel for num_threads(static_cast <int>(threads)) schedule(static)
  for (std::int64_t t = 0; t < threads; ++t) {
    const std::int64_t begin = std::min(n, t * per), end = std::min(n, begin + per);
    if (begin < end) fn(begin, end);
  }
}

}  // namespace

template <typename Scalar>
void linear_forward(const LinearShape& s, const Scalar* x, const Scalar* w, Scalar* y) {
  const ConstMap<Scalar> W(w, s.out, s.in, Eigen::OuterStride<>(s.in));
  split(s.rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    const ConstMap<Scalar> X(x + r0 * s.in, r1 - r0, s.in, Eigen::OuterStride<>(s.in));
    Map<Scalar> Y(y + r0 * s.out, r1 - r0, s.out, Eigen::OuterStride<>(s.out));
    Y.noalias() = X * W.transpose();
  });
}

template <typename Scalar>
void linear_backward_input(const LinearShape& s, const Scalar* dy, const Scalar* w, Scalar* dx,
                           bool accumulate) {
  const ConstMap<Scalar> W(w, s.out, s.in, Eigen::OuterStride<>(s.in));
  split(s.rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    const ConstMap<Scalar> dY(dy + r0 * s.out, r1 - r0, s.out, Eigen::OuterStride<>(s.out));
    Map<Scalar> dX(dx + r0 * s.in, r1 - r0, s.in, Eigen::OuterStride<>(s.in));
    if (accumulate)
      dX.noalias() += dY * W;
    else
      dX.noalias() = dY * W;
  });
}

// Each thread takes a block of w's rows: dw[o0:o1, :] = dy[:, o0:o1]^T x.
template <typename Scalar>
void linear_backward_weight(const LinearShape& s, const Scalar* dy, const Scalar* x, Scalar* dw) {
  const ConstMap<Scalar> X(x, s.rows, s.in, Eigen::OuterStride<>(s.in));
  const bool by_rows = s.out >= 16;  // tiny outputs (in_proj_b, in_proj_a): split the columns
  split(by_rows ? s.out : s.in, 16, [&](std::int64_t c0, std::int64_t c1) {
    if (by_rows) {
      const ConstMap<Scalar> dY(dy + c0, s.rows, c1 - c0, Eigen::OuterStride<>(s.out));
      Map<Scalar> dW(dw + c0 * s.in, c1 - c0, s.in, Eigen::OuterStride<>(s.in));
      dW.noalias() = dY.transpose() * X;
    } else {
      const ConstMap<Scalar> dY(dy, s.rows, s.out, Eigen::OuterStride<>(s.out));
      const ConstMap<Scalar> Xc(x + c0, s.rows, c1 - c0, Eigen::OuterStride<>(s.in));
      Map<Scalar> dW(dw + c0, s.out, c1 - c0, Eigen::OuterStride<>(s.in));
      dW.noalias() = dY.transpose() * Xc;
    }
  });
}

template void linear_forward(const LinearShape&, const float*, const float*, float*);
template void linear_forward(const LinearShape&, const double*, const double*, double*);
template void linear_backward_input(const LinearShape&, const float*, const float*, float*, bool);
template void linear_backward_input(const LinearShape&, const double*, const double*, double*,
                                    bool);
template void linear_backward_weight(const LinearShape&, const float*, const float*, float*);
template void linear_backward_weight(const LinearShape&, const double*, const double*, double*);

}  // namespace gdn::layer
