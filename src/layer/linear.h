#pragma once
// The layer's bias-free projections y = x W^T (nn.Linear), forward and backward, as Eigen GEMMs
// over row-major buffers. The library builds Eigen single-threaded (EIGEN_DONT_PARALLELIZE), so
// each call splits its output into one block per OpenMP thread.

#include <cstdint>

namespace gdn::layer {

// Shapes: x [rows, in], w [out, in], y [rows, out], all row-major. Scalar is float or double.
struct LinearShape {
  std::int64_t rows, in, out;
};

// y = x w^T
template <typename Scalar>
void linear_forward(const LinearShape& s, const Scalar* x, const Scalar* w, Scalar* y);

// dx = dy w, or dx += dy w when accumulate (several projections read the same x)
template <typename Scalar>
void linear_backward_input(const LinearShape& s, const Scalar* dy, const Scalar* w, Scalar* dx,
                           bool accumulate);

// dw = dy^T x
template <typename Scalar>
void linear_backward_weight(const LinearShape& s, const Scalar* dy, const Scalar* x, Scalar* dw);

}  // namespace gdn::layer
