#include "bench/grid.h"

#include <algorithm>
#include <set>

#include "base/error.h"
#include "decode/option_schema.h"
#include "decode/policy_registry.h"

namespace polestar::bench {
namespace {

std::string Trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

}  // namespace

std::string GridPoint::SettingsText() const {
  std::string text;
  for (const auto& [key, value] : settings) text += (text.empty() ? "" : " ") + key + "=" + value;
  return text.empty() ? "defaults" : text;
}

std::string GridPoint::Label() const {
  return settings.empty() ? policy : policy + " " + SettingsText();
}

std::string NormaliseKey(std::string key) {
  while (!key.empty() && key.front() == '-') key.erase(key.begin());
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

std::vector<std::string> SplitList(const std::string& text, char separator, const char* what) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    const std::string item = Trim(text.substr(start, end == std::string::npos ? end : end - start));
    if (item.empty()) Fail(what, ": empty item in '", text, "'");
    items.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return items;
}

std::vector<GridAxis> ParseGrid(const std::string& spec) {
  std::vector<GridAxis> axes;
  std::set<std::string> seen;
  for (const std::string& part : SplitList(spec, ';', "--grid")) {
    const size_t eq = part.find('=');
    if (eq == std::string::npos) {
      Fail("--grid: axis '", part, "' has no '=' (expected key=value,value,...)");
    }
    GridAxis axis;
    axis.key = NormaliseKey(Trim(part.substr(0, eq)));
    if (axis.key.empty()) Fail("--grid: axis '", part, "' has no key");
    // An option named twice, by its name and by an alias ("topk", "topk-clusters"), too.
    const OptionSpec* option = FindOption(axis.key);
    if (!seen.insert(option ? option->name : axis.key).second)
      Fail("--grid: key '", axis.key, "' appears twice in '", spec, "'");
    const std::string values = part.substr(eq + 1);
    if (Trim(values).empty()) Fail("--grid: key '", axis.key, "' has no values");
    axis.values = SplitList(values, ',', "--grid");
    axes.push_back(std::move(axis));
  }
  return axes;
}

std::vector<GridPoint> ExpandGrids(const std::vector<std::string>& policies,
                                   const std::vector<std::string>& grid_specs) {
  std::vector<std::vector<GridAxis>> grids;
  for (const std::string& spec : grid_specs) grids.push_back(ParseGrid(spec));
  if (grids.empty()) grids.emplace_back();
  std::vector<GridPoint> points;
  std::set<std::string> labels;
  for (std::vector<GridAxis> axes : grids) {
    const bool has_policy =
        std::any_of(axes.begin(), axes.end(), [](const GridAxis& a) { return a.key == "policy"; });
    if (!has_policy) {
      if (policies.empty()) Fail("no policy given (--policies or a policy= axis in --grid)");
      axes.insert(axes.begin(), GridAxis{"policy", policies});
    }
    for (const GridAxis& axis : axes) {
      if (axis.key != "policy") continue;
      for (const std::string& p : axis.values) {
        if (!IsKnownPolicy(p)) Fail("unknown policy '", p, "' (known: ", KnownPolicies(), ")");
      }
    }
    // Mixed-radix count over the axes, the last one turning fastest.
    size_t total = 1;
    for (const GridAxis& axis : axes) total *= axis.values.size();
    for (size_t n = 0; n < total; ++n) {
      GridPoint point;
      std::vector<Setting> settings(axes.size());
      size_t rest = n;
      for (size_t a = axes.size(); a-- > 0;) {
        settings[a] = {axes[a].key, axes[a].values[rest % axes[a].values.size()]};
        rest /= axes[a].values.size();
      }
      for (auto& [key, value] : settings) {
        if (key == "policy") {
          point.policy = value;
        } else {
          point.settings.emplace_back(key, value);
        }
      }
      if (labels.insert(point.Label()).second) points.push_back(std::move(point));
    }
  }
  return points;
}

}  // namespace polestar::bench
