// Random-weight checkpoints at real shapes, for measuring system cost where a real
// checkpoint is too big to download or to run: a valid Hugging Face folder (config.json in
// the real model's format, safetensors with the real tensor names, sharded with an index
// when large) that Model::Load reads like any other.
//
// Weights are uniform in [-a, a] with a = 0.02 * sqrt(3) (standard deviation 0.02, the
// models' init_std); norm weights are 1 and biases 0. Every tensor is generated in chunks
// from (seed, tensor, chunk), so files are identical whatever the thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/architecture.h"

namespace polestar::bench {

// A model family member's sizes (CheckpointShape: name, vocab, width, layers, heads, ...)
// and its architecture, which writes its config.json and names its tensors.
struct ModelShape : CheckpointShape {
  const Architecture* arch = nullptr;
};

// Every registered architecture's presets (Architecture::random_shapes), e.g. llada-8b,
// llada-1b (a ~1.3B LLaDA-shaped config: width 2048, 16 layers, the real vocabulary),
// llada-tiny (a few MB, for tests), dream-7b, dream-tiny.
const std::vector<ModelShape>& KnownShapes();
// Throws Error listing the known names.
ModelShape ShapeByName(const std::string& name);

struct RandomModelOptions {
  ModelShape shape;
  // Multiplies the layer count (rounded, at least 1): per-layer shapes stay real, so
  // per-layer costs are the real model's and a step's cost scales with the layers kept.
  double scale = 1.0;
  DType dtype = DType::kBF16;  // kBF16 or kF32
  uint64_t seed = 0;
  int64_t max_shard_bytes = int64_t{4} << 30;  // larger checkpoints are sharded
};

struct RandomModelSummary {
  ModelShape shape;  // after scaling
  int64_t parameters = 0;
  // What one token's forward pass multiplies by: all but the routed experts it skips.
  int64_t active_parameters = 0;
  int64_t bytes = 0;               // tensor data over all files
  std::vector<std::string> files;  // written, relative to the folder
};

// The shape after `scale` is applied; throws Error for a scale that is not positive.
ModelShape ScaledShape(const ModelShape& shape, double scale);

// Creates `dir` (or reuses an empty or previously written one) and writes config.json and
// the weights. Throws Error naming the folder or the bad option.
RandomModelSummary WriteRandomModel(const std::string& dir, const RandomModelOptions& options);

}  // namespace polestar::bench
