#include "decode/policy.h"

#include <algorithm>

#include "base/error.h"

namespace polestar {

std::string step_kind::Refresh(int clusters) { return Cat("refresh step, k=", clusters); }

std::string step_kind::RefreshFromLayer(int layer, int layers) {
  return Cat("refresh from layer ", layer, " of ", layers);
}

std::vector<int> Range(int begin, int end) {
  std::vector<int> rows;
  rows.reserve(size_t(std::max(0, end - begin)));
  for (int i = begin; i < end; ++i) rows.push_back(i);
  return rows;
}

}  // namespace polestar
