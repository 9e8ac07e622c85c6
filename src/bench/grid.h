// Grids of decoding settings: which (policy, settings) points a benchmark runs.
//
// A grid spec is a ';'-separated list of axes, each "key=value,value,...", where a key is a
// decoding option by any of its names in the option schema: a flag without its dashes or a
// field (threshold, block_length or block-length, gen_length, clusters, topk, early-commit,
// ...), or "policy". The points are the cartesian product of the
// axes, the first axis varying slowest. Every grid is crossed with the --policies list
// unless it has a policy axis of its own, and several grids are concatenated:
//
//   --policies vanilla,polestar --grid "threshold=0.7,0.9;block_length=8,16"
//     -> 2 policies x 2 thresholds x 2 block lengths = 8 points
//   --grid "policy=polestar;clusters=4,8" --grid "policy=fast-dllm-dual;threshold=0.8"
//     -> 3 points
//
// Duplicate points (same policy and settings) are run once.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "decode/options.h"

namespace polestar::bench {

using Setting = std::pair<std::string, std::string>;  // (key in dash form, value)

struct GridAxis {
  std::string key;  // normalised: "block-length", "policy"
  std::vector<std::string> values;
};

struct GridPoint {
  std::string policy;
  std::vector<Setting> settings;  // in axis order, policy excluded
  // "polestar threshold=0.9 block-length=8"
  std::string Label() const;
  // "threshold=0.9 block-length=8", or "defaults"
  std::string SettingsText() const;
};

// Keys are written with dashes ("block_length" -> "block-length"), as the CLI flags are.
std::string NormaliseKey(std::string key);

// Throws Error for an empty axis, a missing '=', an empty value or a repeated key.
std::vector<GridAxis> ParseGrid(const std::string& spec);

// All points, in order, without duplicates. `policies` applies to grids without a policy
// axis (and alone when there is no grid). Throws Error for an unknown policy.
std::vector<GridPoint> ExpandGrids(const std::vector<std::string>& policies,
                                   const std::vector<std::string>& grid_specs);

// Sets one decoding option from its flag name and text value; throws Error for an unknown
// key or a bad value. The CLI provides one built on the shared decode flags.
using OptionSetter =
    std::function<void(DecodeOptions&, const std::string& key, const std::string& value)>;

// Splits "a,b,c" (spaces trimmed, empty items rejected with an Error naming `what`).
std::vector<std::string> SplitList(const std::string& text, char separator, const char* what);

}  // namespace polestar::bench
