#include "cp/summaries.h"

#include <algorithm>

#include "core/layout.h"
#include "cpu/summary.h"

namespace gdn::cp {

AffineMaps forward_maps(const ShardPlan& plan, const DeltaRuleInputs& shard) {
  const DeltaRuleShape& s = plan.shape;
  AffineMaps maps = AffineMaps::zeros(plan.chains * s.HV, s.K, s.V);
  // Segments that continue enter with zero here, so N is the part that does not depend on it.
  const std::vector<float> zeros(static_cast<std::size_t>(plan.carried_size()), 0.0f);
  const LocalProblem local(plan, shard, zeros.data());
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& seg = plan.segments[i];
    if (!seg.to_next) continue;
    const std::int64_t first = seg.chain * s.HV;
    cpu::chunked_summary(local.inputs, s, static_cast<std::int64_t>(i),
                         seg.from_previous ? maps.M(first) : nullptr, maps.N(first));
  }
  return maps;
}

AffineMaps backward_maps(const ShardPlan& plan, const LocalProblem& local, const TensorRef& d_o,
                         const TensorRef& d_final_state, AffineMaps forward) {
  const DeltaRuleShape& s = plan.shape;
  AffineMaps maps = std::move(forward);
  maps.transpose_matrices();
  std::fill(maps.data.begin() + maps.count * s.K * s.K, maps.data.end(), 0.0f);
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& seg = plan.segments[i];
    if (!seg.from_previous) continue;
    // A segment that also leaves has M; one that ends here sees the user's dS_T instead.
    std::vector<float> d_final;
    if (!seg.to_next && d_final_state.given()) {
      d_final.resize(static_cast<std::size_t>(plan.state_size()));
      core::load_row(d_final_state, seg.sequence * plan.state_size(), plan.state_size(),
                    d_final.data());
    }
    if (!seg.to_next) std::fill_n(maps.M(seg.chain * s.HV), s.HV * s.K * s.K, 0.0f);
    cpu::chunked_initial_state_grad(local.inputs, s, static_cast<std::int64_t>(i), d_o,
                                    d_final.empty() ? nullptr : d_final.data(),
                                    maps.N(seg.chain * s.HV));
  }
  return maps;
}

}  // namespace gdn::cp
