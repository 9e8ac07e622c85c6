#include "base/error.h"
#include "decode/policy.h"

namespace polestar {

std::unique_ptr<Policy> MakeElasticCachePolicy(const DecodeOptions& options, const Model& model) {
  Fail("policy ", options.policy, " is not built yet");
}

}  // namespace polestar
