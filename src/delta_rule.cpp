#include "gdn/delta_rule.h"

#include "cpu/chunked.h"
#include "cpu/recurrence.h"
#include "gdn/error.h"
#include "validate.h"

namespace gdn {

void delta_rule_forward(const DeltaRuleInputs& in, const DeltaRuleOutputs& out, Method method) {
  const DeltaRuleShape shape = validate(in);
  validate_outputs(in, shape, out);
  switch (method) {
    case Method::chunked:
      return cpu::chunked_forward(in, shape, out);
    case Method::recurrent:
      return cpu::recurrent_forward(in, shape, out);
  }
  throw Error("method must be Method::chunked or Method::recurrent");
}

void delta_rule_backward(const DeltaRuleInputs& in, const DeltaRuleGrads& grads, Method method) {
  const DeltaRuleShape shape = validate(in);
  validate_grads(in, shape, grads);
  switch (method) {
    case Method::chunked:
      return cpu::chunked_backward(in, shape, grads);
    case Method::recurrent:
      return cpu::recurrent_backward(in, shape, grads);
  }
  throw Error("method must be Method::chunked or Method::recurrent");
}

}  // namespace gdn
