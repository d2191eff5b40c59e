#include "gdn/padding_mask.h"

#include <fmt/format.h>

#include "core/convert.h"
#include "gdn/error.h"

namespace gdn {

void apply_padding_mask(const TensorRef& x, const TensorRef& mask) {
  if (x.shape.size() != 3)
    throw Error(fmt::format("hidden states must have shape [B, T, D], got {}", x.shape_string()));
  if (mask.shape.size() != 2)
    throw Error(
        fmt::format("only a 2-D padding mask [B, T] is supported, got attention_mask of "
                    "rank {} {}",
                    mask.shape.size(), mask.shape_string()));
  if (mask.shape[0] != x.shape[0] || mask.shape[1] != x.shape[1])
    throw Error(fmt::format("attention_mask must have shape [B, T] = [{}, {}], got {}", x.shape[0],
                            x.shape[1], mask.shape_string()));
  const std::int64_t rows = x.shape[0] * x.shape[1], D = x.shape[2];
  // A dropped token becomes 0 whatever it held: x * 0 would keep a NaN or inf there, and the
  // conv would carry it into the valid tokens after it.
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto keep = core::load<double>(mask, r);
    for (std::int64_t d = 0; d < D; ++d)
      core::store(x, r * D + d, keep == 0 ? 0.0 : core::load<double>(x, r * D + d) * keep);
  }
}

}  // namespace gdn
