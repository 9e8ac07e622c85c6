#include "bench/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/parallel.h"
#include "io/atomic_file.h"

namespace polestar::bench {
namespace {

namespace fs = std::filesystem;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  enum class Fill { kRandom, kOnes, kZeros } fill = Fill::kRandom;

  int64_t Elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The tensors of the `arch` checkpoint that `config` (its config.json) describes, in name
// order: exactly those Model::Load binds.
std::vector<TensorSpec> TensorsOf(const Architecture& arch, const nlohmann::ordered_json& config,
                                  const std::string& config_path) {
  const ModelConfig c = ParseHfConfig(arch, nlohmann::json::parse(config.dump()), config_path);
  std::vector<TensorSpec> t;
  for (CheckpointTensor& tensor : CheckpointTensors(c, arch.hf_tensors)) {
    using Kind = CheckpointTensor::Kind;
    const TensorSpec::Fill fill = tensor.kind == Kind::kNorm   ? TensorSpec::Fill::kOnes
                                  : tensor.kind == Kind::kBias ? TensorSpec::Fill::kZeros
                                                               : TensorSpec::Fill::kRandom;
    t.push_back({std::move(tensor.name), std::move(tensor.shape), fill});
  }
  std::sort(t.begin(), t.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  return t;
}

// Fills out[n] (bytes of `dtype`) with values `first`.. of the tensor's stream.
void FillChunk(const TensorSpec& t, uint64_t seed, size_t tensor_index, int64_t chunk, int64_t n,
               DType dtype, uint8_t* out) {
  constexpr float kHalfRange = 0.02f * 1.7320508f;  // uniform with standard deviation 0.02
  uint64_t state = seed ^ (uint64_t(tensor_index) << 40) ^ uint64_t(chunk) * 0x2545f4914f6cdd1dull;
  for (int64_t i = 0; i < n; ++i) {
    float value = t.fill == TensorSpec::Fill::kOnes ? 1.0f : 0.0f;
    if (t.fill == TensorSpec::Fill::kRandom) {
      const double unit = double(SplitMix(state) >> 11) * 0x1.0p-53;  // [0, 1)
      value = float((2.0 * unit - 1.0) * kHalfRange);
    }
    if (dtype == DType::kBF16) {
      const uint16_t bits = F32ToBf16(value);
      std::memcpy(out + 2 * i, &bits, 2);
    } else {
      std::memcpy(out + 4 * i, &value, 4);
    }
  }
}

// Writes one safetensors file holding `tensors`, generating the data chunk by chunk.
void WriteShard(const std::string& path, const std::vector<const TensorSpec*>& tensors,
                const std::vector<size_t>& indices, DType dtype, uint64_t seed) {
  const int64_t element_bytes = dtype == DType::kBF16 ? 2 : 4;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}, {"source", "polestar make-random-model"}};
  uint64_t offset = 0;
  for (const TensorSpec* t : tensors) {
    const uint64_t bytes = uint64_t(t->Elements() * element_bytes);
    header[t->name] = {{"dtype", dtype == DType::kBF16 ? "BF16" : "F32"},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  AtomicFile out(path);
  const uint64_t length = text.size();
  out.Write(&length, 8);
  out.Write(text);
  constexpr int64_t kChunk = int64_t{1} << 20;  // values per generated chunk
  constexpr int64_t kChunksPerBatch = 64;       // generated in parallel, then written
  std::vector<uint8_t> buffer;                  // [kChunksPerBatch * kChunk * element_bytes]
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = *tensors[i];
    const int64_t elements = t.Elements();
    const int64_t chunks = (elements + kChunk - 1) / kChunk;
    for (int64_t first = 0; first < chunks; first += kChunksPerBatch) {
      const int64_t batch = std::min(kChunksPerBatch, chunks - first);
      const int64_t begin = first * kChunk, end = std::min(elements, (first + batch) * kChunk);
      buffer.resize(size_t((end - begin) * element_bytes));
      ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t start = (first + b) * kChunk;
          const int64_t n = std::min(kChunk, elements - start);
          FillChunk(t, seed, indices[i], first + b, n, dtype,
                    buffer.data() + (start - begin) * element_bytes);
        }
      });
      out.Write(buffer.data(), buffer.size());
    }
  }
  out.Commit();
}

}  // namespace

const std::vector<ModelShape>& KnownShapes() {
  static const std::vector<ModelShape> shapes = [] {
    std::vector<ModelShape> all;
    for (const Architecture* arch : Architectures()) {
      for (const CheckpointShape& shape : arch->random_shapes) all.push_back({shape, arch});
    }
    return all;
  }();
  return shapes;
}

ModelShape ShapeByName(const std::string& name) {
  std::string known;
  for (const ModelShape& s : KnownShapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  Fail("unknown model shape '", name, "' (known: ", known, ")");
}

ModelShape ScaledShape(const ModelShape& shape, double scale) {
  if (!(scale > 0)) Fail("--scale must be positive (got ", scale, ")");
  ModelShape s = shape;
  s.layers = std::max(1, int(std::lround(shape.layers * scale)));
  if (scale != 1.0) s.name = Cat(shape.name, "-x", scale);
  return s;
}

RandomModelSummary WriteRandomModel(const std::string& dir, const RandomModelOptions& options) {
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF32) {
    Fail("random models are written in BF16 or F32 (got ", DTypeName(options.dtype), ")");
  }
  RandomModelSummary summary;
  summary.shape = ScaledShape(options.shape, options.scale);
  const ModelShape& s = summary.shape;
  if (s.width <= 0 || s.heads <= 0 || s.width % s.heads != 0 || s.kv_heads <= 0 ||
      s.heads % s.kv_heads != 0 || s.ffn <= 0 || s.vocab <= 0) {
    Fail("model shape ", s.name, " is inconsistent (width ", s.width, ", heads ", s.heads,
         ", kv heads ", s.kv_heads, ", ffn ", s.ffn, ", vocab ", s.vocab, ")");
  }
  if (std::max({s.mask_id, s.eos_id, s.bos_id, s.eot_id}) >= s.vocab) {
    Fail("model shape ", s.name, ": special token ids must lie below the vocabulary size ",
         s.vocab);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) Fail(dir, ": cannot create the folder (", ec.message(), ")");
  // Never overwrite a real checkpoint; do remove what an earlier run wrote, so a smaller
  // model does not leave stale shards behind.
  const fs::path config_path = fs::path(dir) / "config.json";
  if (fs::exists(config_path)) {
    std::ifstream in(config_path);
    const nlohmann::json existing = nlohmann::json::parse(in, nullptr, false);
    if (existing.is_discarded() || !existing.value("polestar_random_weights", false)) {
      Fail(dir, ": holds a checkpoint that make-random-model did not write; choose another folder");
    }
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) == 0 &&
        (name.ends_with(".safetensors") || name.ends_with(".index.json"))) {
      fs::remove(entry.path());
    }
  }

  const nlohmann::ordered_json config = s.arch->random_config(s);
  const std::vector<TensorSpec> tensors = TensorsOf(*s.arch, config, config_path.string());
  const int64_t element_bytes = options.dtype == DType::kBF16 ? 2 : 4;
  // Greedy sharding in name order, as transformers' save_pretrained does.
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t bytes = tensors[i].Elements() * element_bytes;
    summary.parameters += tensors[i].Elements();
    summary.bytes += bytes;
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
  }
  summary.active_parameters = summary.parameters;
  if (s.experts > 0) {
    const int64_t routed_layers = s.layers - std::min(s.dense_layers, s.layers);
    summary.active_parameters -=
        routed_layers * int64_t(s.experts - s.experts_per_token) * 3 * s.width * s.expert_ffn;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    std::vector<const TensorSpec*> members;
    for (size_t i : shards[k]) {
      members.push_back(&tensors[i]);
      weight_map[tensors[i].name] = file;
    }
    WriteShard((fs::path(dir) / file).string(), members, shards[k], options.dtype, options.seed);
    summary.files.push_back(file);
  }
  if (shards.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", summary.bytes}}},
                                          {"weight_map", weight_map}};
    WriteFileAtomically((fs::path(dir) / "model.safetensors.index.json").string(),
                        index.dump(2) + "\n");
    summary.files.push_back("model.safetensors.index.json");
  }
  WriteFileAtomically(config_path.string(), config.dump(2) + "\n");
  summary.files.push_back("config.json");
  return summary;
}

}  // namespace polestar::bench
