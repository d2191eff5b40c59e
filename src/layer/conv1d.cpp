#include "gdn/conv1d.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "cpu/convert.h"
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

// x at row t of batch b, where t < 0 reads the halo (or zero).
double input(const Conv1dArgs& a, const ConvShape& s, std::int64_t b, std::int64_t t,
             std::int64_t d) {
  if (t >= 0) return cpu::load<double>(a.x, (b * s.T + t) * s.D + d);
  if (!a.halo.given()) return 0.0;
  return cpu::load<double>(a.halo, (b * (s.W - 1) + (s.W - 1 + t)) * s.D + d);
}

double pre_activation(const Conv1dArgs& a, const ConvShape& s, std::int64_t b, std::int64_t t,
                      std::int64_t d) {
  double z = 0;
  for (std::int64_t j = 0; j < s.W; ++j)
    z += cpu::load<double>(a.weight, d * s.W + j) * input(a, s, b, t - (s.W - 1) + j, d);
  return z;
}

}  // namespace

void conv1d_forward(const Conv1dArgs& a, const TensorRef& y) {
  const ConvShape s = check(a);
  require("y", y, {s.B, s.T, s.D});
#pragma omp parallel for collapse(2)
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.T; ++t)
      for (std::int64_t d = 0; d < s.D; ++d) {
        const double z = pre_activation(a, s, b, t, d);
        cpu::store(y, (b * s.T + t) * s.D + d, z * sigmoid(z));  // silu
      }
}

void conv1d_backward(const Conv1dArgs& a, const TensorRef& dy, const TensorRef& dx,
                     const TensorRef& dweight, const TensorRef& dhalo) {
  const ConvShape s = check(a);
  require("dy", dy, {s.B, s.T, s.D});
  require("dx", dx, {s.B, s.T, s.D});
  require("dweight", dweight, {s.D, 1, s.W});
  if (dhalo.given()) require("dhalo", dhalo, {s.B, s.W - 1, s.D});
  // dz = dy silu'(z), silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))); then dx and dw by the taps.
  std::vector<double> dz(static_cast<std::size_t>(s.B * s.T * s.D));
#pragma omp parallel for collapse(2)
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.T; ++t)
      for (std::int64_t d = 0; d < s.D; ++d) {
        const std::int64_t i = (b * s.T + t) * s.D + d;
        const double z = pre_activation(a, s, b, t, d), sz = sigmoid(z);
        dz[static_cast<std::size_t>(i)] = cpu::load<double>(dy, i) * sz * (1 + z * (1 - sz));
      }
  // Row t of the extended input [halo; x] feeds outputs t .. t + W - 1 through taps W - 1 .. 0.
  const auto grad_input = [&](std::int64_t b, std::int64_t t, std::int64_t d) {
    double sum = 0;
    for (std::int64_t j = 0; j < s.W; ++j) {
      const std::int64_t out = t + (s.W - 1) - j;
      if (out >= 0 && out < s.T)
        sum += cpu::load<double>(a.weight, d * s.W + j) *
               dz[static_cast<std::size_t>((b * s.T + out) * s.D + d)];
    }
    return sum;
  };
#pragma omp parallel for collapse(2)
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < s.T; ++t)
      for (std::int64_t d = 0; d < s.D; ++d)
        cpu::store(dx, (b * s.T + t) * s.D + d, grad_input(b, t, d));
  if (dhalo.given())
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t t = 1 - s.W; t < 0; ++t)
        for (std::int64_t d = 0; d < s.D; ++d)
          cpu::store(dhalo, (b * (s.W - 1) + (s.W - 1 + t)) * s.D + d, grad_input(b, t, d));
#pragma omp parallel for
  for (std::int64_t d = 0; d < s.D; ++d)
    for (std::int64_t j = 0; j < s.W; ++j) {
      double sum = 0;
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t t = 0; t < s.T; ++t)
          sum += dz[static_cast<std::size_t>((b * s.T + t) * s.D + d)] *
                 input(a, s, b, t - (s.W - 1) + j, d);
      cpu::store(dweight, d * s.W + j, sum);
    }
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
              cpu::load<double>(shard.x, (b * s.T + s.T - (s.W - 1) + t) * s.D + d);
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
        cpu::store(dx, i,
                   cpu::load<double>(dx, i) + d_tail.as<double>()[(b * (s.W - 1) + t) * s.D + d]);
      }
}

}  // namespace gdn
