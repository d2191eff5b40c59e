#include "gdn/conv1d.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/layout.h"
#include "gdn/error.h"

namespace gdn {
namespace {

struct ConvShape {
  std::int64_t B, T, D, W;
};

ConvShape check(const Conv1dArgs& a) {
  if (a.x.shape.size() != 3)
    throw Error(fmt::format("conv1d x must have shape [B, T, D], got {}", a.x.shape_string()));
  const std::int64_t B = a.x.shape[0], T = a.x.shape[1], D = a.x.shape[2];
  if (a.weight.shape.size() != 3 || a.weight.shape[0] != D || a.weight.shape[1] != 1 ||
      a.weight.shape[2] < 1)
    throw Error(fmt::format("conv1d weight must have shape [D, 1, W] = [{}, 1, W], got {}", D,
                            a.weight.shape_string()));
  const std::int64_t W = a.weight.shape[2];
  if (a.halo.given() && a.halo.shape != std::vector<std::int64_t>{B, W - 1, D})
    throw Error(fmt::format("conv1d halo must have shape [B, W - 1, D] = [{}, {}, {}], got {}", B,
                            W - 1, D, a.halo.shape_string()));
  return {B, T, D, W};
}

void require(const char* name, const TensorRef& t, const std::vector<std::int64_t>& shape) {
  if (!t.given() || t.shape != shape)
    throw Error(fmt::format("conv1d {} must be given with shape {}", name,
                            TensorRef{nullptr, DType::f32, shape}.shape_string()));
}

double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}

// The input with the rows before it: [B, W - 1 + T, D] in float64 (halo, or zeros, then x).
std::vector<double> extended_input(const Conv1dArgs& a, const ConvShape& s) {
  const std::int64_t rows = s.W - 1 + s.T;
  std::vector<double> ext(static_cast<std::size_t>(s.B * rows * s.D), 0.0);
  for (std::int64_t b = 0; b < s.B; ++b) {
    double* dst = ext.data() + b * rows * s.D;
    if (a.halo.given()) core::load_row(a.halo, b * (s.W - 1) * s.D, (s.W - 1) * s.D, dst);
    core::load_row(a.x, b * s.T * s.D, s.T * s.D, dst + (s.W - 1) * s.D);
  }
  return ext;
}

// z[b, t, :] = sum_j w[:, j] ext[b, t + j, :], a row of D channels at a time.
void pre_activation_row(const std::vector<double>& ext, const std::vector<double>& w,
                        const ConvShape& s, std::int64_t b, std::int64_t t, double* z) {
  const double* in = ext.data() + (b * (s.W - 1 + s.T) + t) * s.D;
  std::fill_n(z, s.D, 0.0);
  for (std::int64_t j = 0; j < s.W; ++j)
    for (std::int64_t d = 0; d < s.D; ++d)
      z[d] += w[static_cast<std::size_t>(j * s.D + d)] * in[j * s.D + d];
}

// The weight [D, 1, W] as [W, D] float64, so that a row of channels is contiguous.
std::vector<double> taps(const Conv1dArgs& a, const ConvShape& s) {
  std::vector<double> w(static_cast<std::size_t>(s.W * s.D));
  for (std::int64_t d = 0; d < s.D; ++d)
    for (std::int64_t j = 0; j < s.W; ++j)
      w[static_cast<std::size_t>(j * s.D + d)] = core::load<double>(a.weight, d * s.W + j);
  return w;
}

}  // namespace

void conv1d_forward(const Conv1dArgs& a, const TensorRef& y) {
  const ConvShape s = check(a);
  require("y", y, {s.B, s.T, s.D});
  const std::vector<double> ext = extended_input(a, s), w = taps(a, s);
#pragma omp parallel
  {
    std::vector<double> z(static_cast<std::size_t>(s.D));
#pragma omp for collapse(2)
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t t = 0; t < s.T; ++t) {
        pre_activation_row(ext, w, s, b, t, z.data());
        for (double& v : z) v *= sigmoid(v);  // silu
        core::store_row(y, (b * s.T + t) * s.D, s.D, z.data());
      }
  }
}

void conv1d_backward(const Conv1dArgs& a, const TensorRef& dy, const TensorRef& dx,
                     const TensorRef& dweight, const TensorRef& dhalo) {
  const ConvShape s = check(a);
  require("dy", dy, {s.B, s.T, s.D});
  require("dx", dx, {s.B, s.T, s.D});
  require("dweight", dweight, {s.D, 1, s.W});
  if (dhalo.given()) require("dhalo", dhalo, {s.B, s.W - 1, s.D});
  const std::vector<double> ext = extended_input(a, s), w = taps(a, s);
  const std::int64_t rows = s.W - 1 + s.T;
  // dz = dy silu'(z), silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))).
  std::vector<double> dz(static_cast<std::size_t>(s.B * s.T * s.D));
#pragma omp parallel
  {
    std::vector<double> z(static_cast<std::size_t>(s.D)), g(z.size());
#pragma omp for collapse(2)
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t t = 0; t < s.T; ++t) {
        pre_activation_row(ext, w, s, b, t, z.data());
        core::load_row(dy, (b * s.T + t) * s.D, s.D, g.data());
        double* out = dz.data() + (b * s.T + t) * s.D;
        for (std::int64_t d = 0; d < s.D; ++d) {
          const double sz = sigmoid(z[d]);
          out[d] = g[d] * sz * (1 + z[d] * (1 - sz));
        }
      }
  }
  // Row r of the extended input feeds outputs r - j through tap j: d_ext[r] = sum_j w_j dz[r - j].
#pragma omp parallel
  {
    std::vector<double> row(static_cast<std::size_t>(s.D));
#pragma omp for collapse(2)
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t r = 0; r < rows; ++r) {
        if (r < s.W - 1 && !dhalo.given()) continue;
        std::fill(row.begin(), row.end(), 0.0);
        for (std::int64_t j = 0; j < s.W; ++j) {
          const std::int64_t t = r - j;
          if (t < 0 || t >= s.T) continue;
          const double* g = dz.data() + (b * s.T + t) * s.D;
          for (std::int64_t d = 0; d < s.D; ++d)
            row[d] += w[static_cast<std::size_t>(j * s.D + d)] * g[d];
        }
        if (r < s.W - 1)
          core::store_row(dhalo, (b * (s.W - 1) + r) * s.D, s.D, row.data());
        else
          core::store_row(dx, (b * s.T + r - (s.W - 1)) * s.D, s.D, row.data());
      }
  }
  // dw[d, j] = sum_{b, t} dz[b, t, d] ext[b, t + j, d]
  std::vector<double> dw(static_cast<std::size_t>(s.W * s.D), 0.0);
#pragma omp parallel for
  for (std::int64_t j = 0; j < s.W; ++j)
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t t = 0; t < s.T; ++t) {
        const double* g = dz.data() + (b * s.T + t) * s.D;
        const double* in = ext.data() + (b * rows + t + j) * s.D;
        double* acc = dw.data() + j * s.D;
        for (std::int64_t d = 0; d < s.D; ++d) acc[d] += g[d] * in[d];
      }
  for (std::int64_t d = 0; d < s.D; ++d)
    for (std::int64_t j = 0; j < s.W; ++j)
      core::store(dweight, d * s.W + j, dw[static_cast<std::size_t>(j * s.D + d)]);
}

namespace {

// The previous rank's last W - 1 rows (zeros on rank 0), as f64 [B, W - 1, D].
HostTensor receive_halo(Communicator& comm, const Conv1dArgs& shard, const ConvShape& s) {
  if (s.T < s.W - 1)
    throw Error(
        fmt::format("rank {}: the conv halo needs at least W - 1 = {} rows per rank, got "
                    "{}",
                    comm.rank(), s.W - 1, s.T));
  HostTensor halo = HostTensor::zeros(DType::f64, {s.B, s.W - 1, s.D});
  const std::size_t bytes = halo.bytes.size();
  if (comm.rank() + 1 < comm.size()) {
    HostTensor tail = HostTensor::zeros(DType::f64, {s.B, s.W - 1, s.D});
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t t = 0; t < s.W - 1; ++t)
        for (std::int64_t d = 0; d < s.D; ++d)
          tail.as<double>()[(b * (s.W - 1) + t) * s.D + d] =
              core::load<double>(shard.x, (b * s.T + s.T - (s.W - 1) + t) * s.D + d);
    if (comm.rank() > 0)
      comm.send_recv(tail.bytes.data(), bytes, comm.rank() + 1, halo.bytes.data(), bytes,
                     comm.rank() - 1);
    else
      comm.send(tail.bytes.data(), bytes, comm.rank() + 1);
  } else if (comm.rank() > 0) {
    comm.recv(halo.bytes.data(), bytes, comm.rank() - 1);
  }
  return halo;
}

}  // namespace

void cp_conv1d_forward(Communicator& comm, const Conv1dArgs& shard, const TensorRef& y) {
  const ConvShape s = check(shard);
  const HostTensor halo = receive_halo(comm, shard, s);
  Conv1dArgs args = shard;
  args.halo = halo.ref();
  conv1d_forward(args, y);
}

void cp_conv1d_backward(Communicator& comm, const Conv1dArgs& shard, const TensorRef& dy,
                        const TensorRef& dx, const TensorRef& dweight) {
  const ConvShape s = check(shard);
  const HostTensor halo = receive_halo(comm, shard, s);
  Conv1dArgs args = shard;
  args.halo = halo.ref();
  HostTensor dhalo = HostTensor::zeros(DType::f64, halo.shape);
  conv1d_backward(args, dy, dx, dweight, dhalo.ref());
  // The halo's gradient belongs to the previous rank's last W - 1 rows.
  HostTensor d_tail = HostTensor::zeros(DType::f64, halo.shape);
  const std::size_t bytes = dhalo.bytes.size();
  const bool has_next = comm.rank() + 1 < comm.size(), has_previous = comm.rank() > 0;
  if (has_next && has_previous)
    comm.send_recv(dhalo.bytes.data(), bytes, comm.rank() - 1, d_tail.bytes.data(), bytes,
                   comm.rank() + 1);
  else if (has_previous)
    comm.send(dhalo.bytes.data(), bytes, comm.rank() - 1);
  else if (has_next)
    comm.recv(d_tail.bytes.data(), bytes, comm.rank() + 1);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.W - 1; ++t)
      for (std::int64_t d = 0; d < s.D; ++d) {
        const std::int64_t i = (b * s.T + s.T - (s.W - 1) + t) * s.D + d;
        core::store(dx, i,
                    core::load<double>(dx, i) + d_tail.as<double>()[(b * (s.W - 1) + t) * s.D + d]);
      }
}

}  // namespace gdn
