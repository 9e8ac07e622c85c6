#include "decode/policy.h"

#include <algorithm>

namespace polestar {

std::vector<int> Range(int begin, int end) {
  std::vector<int> rows;
  rows.reserve(size_t(std::max(0, end - begin)));
  for (int i = begin; i < end; ++i) rows.push_back(i);
  return rows;
}

}  // namespace polestar
