#include "cp/affine.h"

#include <Eigen/Dense>

namespace gdn::cp {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<Mat>;
using ConstMap = Eigen::Map<const Mat>;

}  // namespace

AffineMaps AffineMaps::zeros(std::int64_t count, std::int64_t K, std::int64_t V) {
  return {count, K, V, std::vector<float>(static_cast<std::size_t>(count * (K * K + K * V)))};
}

std::vector<float> AffineMaps::apply(const std::vector<float>& x) const {
  std::vector<float> y(static_cast<std::size_t>(count * K * V));
  for (std::int64_t i = 0; i < count; ++i)
    Map(y.data() + i * K * V, K, V).noalias() =
        ConstMap(M(i), K, K) * ConstMap(x.data() + i * K * V, K, V) + ConstMap(N(i), K, V);
  return y;
}

AffineMaps AffineMaps::after(const AffineMaps& first) const {
  AffineMaps out = zeros(count, K, V);
  for (std::int64_t i = 0; i < count; ++i) {
    const ConstMap m2(M(i), K, K);
    Map(out.M(i), K, K).noalias() = m2 * ConstMap(first.M(i), K, K);
    Map(out.N(i), K, V).noalias() = m2 * ConstMap(first.N(i), K, V) + ConstMap(N(i), K, V);
  }
  return out;
}

void AffineMaps::transpose_matrices() {
  for (std::int64_t i = 0; i < count; ++i) Map(M(i), K, K).transposeInPlace();
}

}  // namespace gdn::cp
