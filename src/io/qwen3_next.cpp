#include "io/qwen3_next.h"

#include "core/convert.h"

namespace gdn::io {
namespace {

// rows [from_row, from_row + rows) of `from` -> rows [to_row, ...) of `to`, converting dtypes.
void copy_rows(const HostTensor& from, std::int64_t from_row, HostTensor& to, std::int64_t to_row,
               std::int64_t rows, std::int64_t width) {
  const TensorRef src = from.ref(), dst = to.ref();
  for (std::int64_t i = 0; i < rows * width; ++i)
    core::store(dst, to_row * width + i, core::load<double>(src, from_row * width + i));
}

}  // namespace

void split_qwen3_next(const LayerConfig& c, const HostTensor& qkvz, const HostTensor& ba,
                      DType dtype, LayerWeights& w) {
  const std::int64_t D = c.hidden_size, HK = c.linear_num_key_heads, HV = c.linear_num_value_heads;
  const std::int64_t K = c.linear_key_head_dim, V = c.linear_value_head_dim, r = HV / HK;
  w.in_proj_qkv = HostTensor::zeros(dtype, {c.conv_dim(), D});
  w.in_proj_z = HostTensor::zeros(dtype, {HV * V, D});
  w.in_proj_b = HostTensor::zeros(dtype, {HV, D});
  w.in_proj_a = HostTensor::zeros(dtype, {HV, D});
  const std::int64_t group = 2 * K + 2 * r * V;
  for (std::int64_t i = 0; i < HK; ++i) {
    const std::int64_t at = i * group;
    copy_rows(qkvz, at, w.in_proj_qkv, i * K, K, D);                               // q_i
    copy_rows(qkvz, at + K, w.in_proj_qkv, HK * K + i * K, K, D);                  // k_i
    copy_rows(qkvz, at + 2 * K, w.in_proj_qkv, 2 * HK * K + i * r * V, r * V, D);  // v_i
    copy_rows(qkvz, at + 2 * K + r * V, w.in_proj_z, i * r * V, r * V, D);         // z_i
    copy_rows(ba, i * 2 * r, w.in_proj_b, i * r, r, D);                            // b_i
    copy_rows(ba, i * 2 * r + r, w.in_proj_a, i * r, r, D);                        // a_i
  }
}

}  // namespace gdn::io
