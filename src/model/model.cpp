#include "model/model.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/registry.h"
#include "base/error.h"
#include "io/json_file.h"
#include "io/safetensors.h"

namespace polestar {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

bool IsMatrixType(DType type) { return type != DType::kI64 && type != DType::kI32; }

// Tensors the store holds that nothing binds: a config that disagrees with its checkpoint
// (fewer layers, no biases) would otherwise load and compute the wrong model.
void FailOnUnusedTensors(const TensorStore& store, const std::set<std::string>& bound,
                         const std::string& ignored_lm_head) {
  std::vector<std::string> unused;
  for (const auto& [name, t] : store.tensors()) {
    // Buffers PyTorch saves beside the weights, and an LM head that tied embeddings ignore
    // (as Hugging Face does).
    const bool ignorable = name.ends_with("rotary_emb.inv_freq") || name == ignored_lm_head;
    if (!bound.contains(name) && !ignorable) unused.push_back(name);
  }
  if (unused.empty()) return;
  std::string listed;
  for (size_t i = 0; i < std::min<size_t>(unused.size(), 3); ++i)
    listed += (i ? ", '" : "'") + unused[i] + "'";
  Fail(store.origin(), ": ", unused.size(),
       " tensor(s) are not part of the model its config describes (", listed,
       unused.size() > 3 ? ", ..." : "",
       "): does the config's layer count or layout match the checkpoint?");
}

WeightView BindMatrix(const TensorStore& store, const std::string& name, int64_t rows,
                      int64_t cols) {
  const TensorRef& t = store.Get(name);
  if (t.shape != std::vector<int64_t>{rows, cols}) {
    Fail(store.origin(), ": tensor '", name, "' has shape ", ShapeText(t.shape), ", expected [",
         rows, ", ", cols, "]");
  }
  if (!IsMatrixType(t.dtype) || cols % BlockSize(t.dtype) != 0) {
    Fail(store.origin(), ": tensor '", name, "' has unsupported type ", DTypeName(t.dtype));
  }
  WeightView w;
  w.dtype = t.dtype;
  w.data = t.data;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = RowBytes(t.dtype, cols);
  PS_CHECK(size_t(w.row_bytes * rows) == t.bytes);
  return w;
}

// The E matrices [rows, cols] of `name`: one tensor per expert when the name holds "{}"
// (the expert index), else the slices of one stacked [E, rows, cols] tensor.
std::vector<WeightView> BindExpertMatrices(const TensorStore& store, const std::string& name,
                                           int64_t experts, int64_t rows, int64_t cols,
                                           std::set<std::string>& bound) {
  std::vector<WeightView> views;
  const size_t slot = name.find("{}");
  if (slot != std::string::npos) {
    for (int64_t e = 0; e < experts; ++e) {
      std::string expert_name = name;
      expert_name.replace(slot, 2, std::to_string(e));
      views.push_back(BindMatrix(store, *bound.insert(expert_name).first, rows, cols));
    }
    return views;
  }
  bound.insert(name);
  const TensorRef& t = store.Get(name);
  if (t.shape != std::vector<int64_t>{experts, rows, cols}) {
    Fail(store.origin(), ": tensor '", name, "' has shape ", ShapeText(t.shape), ", expected [",
         experts, ", ", rows, ", ", cols, "]");
  }
  if (!IsMatrixType(t.dtype) || cols % BlockSize(t.dtype) != 0) {
    Fail(store.origin(), ": tensor '", name, "' has unsupported type ", DTypeName(t.dtype));
  }
  const int64_t row_bytes = RowBytes(t.dtype, cols);
  PS_CHECK(size_t(row_bytes * rows * experts) == t.bytes);
  for (int64_t e = 0; e < experts; ++e) {
    views.push_back({t.dtype, t.data + e * rows * row_bytes, rows, cols, row_bytes});
  }
  return views;
}

std::vector<float> BindVector(const TensorStore& store, const std::string& name, int64_t size) {
  const TensorRef& t = store.Get(name);
  if (t.shape != std::vector<int64_t>{size}) {
    Fail(store.origin(), ": tensor '", name, "' has shape ", ShapeText(t.shape), ", expected [",
         size, "]");
  }
  if (!IsMatrixType(t.dtype))
    Fail(store.origin(), ": tensor '", name, "' has type ", DTypeName(t.dtype));
  WeightView view{t.dtype, t.data, 1, size, int64_t(t.bytes)};
  std::vector<float> values(static_cast<size_t>(size));
  DequantizeRow(view, 0, values.data());
  return values;
}

}  // namespace

Model::Model(TensorStore store, ModelConfig config, const TensorNames& names, std::string source)
    : store_(std::move(store)), config_(config), source_(std::move(source)) {
  const ModelConfig& c = config_;
  const int64_t q_width = int64_t(c.heads) * c.head_dim;
  const int64_t kv_width = int64_t(c.kv_heads) * c.head_dim;
  std::set<std::string> bound;  // every tensor name bound below
  auto use = [&bound](const std::string& name) -> const std::string& {
    return *bound.insert(name).first;
  };
  host_.embedding = BindMatrix(store_, use(names.embedding), c.vocab, c.width);
  host_.lm_head = c.tied_embeddings ? host_.embedding
                                    : BindMatrix(store_, use(names.lm_head), c.vocab, c.width);
  host_.final_norm = Keep(BindVector(store_, use(names.final_norm), c.width));
  for (int l = 0; l < c.layers; ++l) {
    auto name = [&](const std::string& leaf) { return use(LayerTensorName(names, l, leaf)); };
    LayerWeights w;
    if (names.qkv.empty()) {
      w.wq = BindMatrix(store_, name(names.q), q_width, c.width);
      w.wk = BindMatrix(store_, name(names.k), kv_width, c.width);
      w.wv = BindMatrix(store_, name(names.v), kv_width, c.width);
    } else {
      // Row slices of the fused projection: q heads, k heads, v heads.
      const WeightView qkv = BindMatrix(store_, name(names.qkv), q_width + 2 * kv_width, c.width);
      auto rows = [&](int64_t first, int64_t count) {
        return WeightView{qkv.dtype, qkv.Row(first), count, qkv.cols, qkv.row_bytes};
      };
      w.wq = rows(0, q_width);
      w.wk = rows(q_width, kv_width);
      w.wv = rows(q_width + kv_width, kv_width);
    }
    w.wo = BindMatrix(store_, name(names.o), c.width, q_width);
    w.attn_norm = Keep(BindVector(store_, name(names.attn_norm), c.width));
    w.ffn_norm = Keep(BindVector(store_, name(names.ffn_norm), c.width));
    if (c.qkv_bias && names.qkv.empty()) {
      w.bq = Keep(BindVector(store_, name(names.q_bias), q_width));
      w.bk = Keep(BindVector(store_, name(names.k_bias), kv_width));
      w.bv = Keep(BindVector(store_, name(names.v_bias), kv_width));
    } else if (c.qkv_bias) {
      const std::vector<float> fused =
          BindVector(store_, name(names.qkv_bias), q_width + 2 * kv_width);
      w.bq = Keep({fused.begin(), fused.begin() + q_width});
      w.bk = Keep({fused.begin() + q_width, fused.begin() + q_width + kv_width});
      w.bv = Keep({fused.begin() + q_width + kv_width, fused.end()});
    }
    if (c.o_bias) w.bo = Keep(BindVector(store_, name(names.o_bias), c.width));
    if (c.qk_norm) {
      w.q_norm = Keep(BindVector(store_, name(names.q_norm), c.head_dim));
      w.k_norm = Keep(BindVector(store_, name(names.k_norm), c.head_dim));
    }
    auto swiglu = [&](const std::string& gate, const std::string& up, const std::string& down,
                      int64_t inner) {
      return SwiGluWeights{BindMatrix(store_, name(gate), inner, c.width),
                           BindMatrix(store_, name(up), inner, c.width),
                           BindMatrix(store_, name(down), c.width, inner)};
    };
    if (!c.IsMoeLayer(l)) {
      w.mlp = swiglu(names.gate, names.up, names.down, c.ffn);
    } else {
      const MoeConfig& moe = c.moe;
      w.router = BindMatrix(store_, name(names.router), moe.experts, c.width);
      if (moe.expert_bias)
        w.expert_bias = Keep(BindVector(store_, name(names.expert_bias), moe.experts));
      auto experts = [&](const std::string& leaf, int64_t rows, int64_t cols) {
        return BindExpertMatrices(store_, LayerTensorName(names, l, leaf), moe.experts, rows, cols,
                                  bound);
      };
      const std::vector<WeightView> gates = experts(names.expert_gate, moe.expert_ffn, c.width);
      const std::vector<WeightView> ups = experts(names.expert_up, moe.expert_ffn, c.width);
      const std::vector<WeightView> downs = experts(names.expert_down, c.width, moe.expert_ffn);
      for (int e = 0; e < moe.experts; ++e) w.experts.push_back({gates[e], ups[e], downs[e]});
      if (moe.shared_ffn > 0)
        w.shared = swiglu(names.shared_gate, names.shared_up, names.shared_down, moe.shared_ffn);
    }
    host_.layers.push_back(std::move(w));
  }
  FailOnUnusedTensors(store_, bound, c.tied_embeddings ? names.lm_head : "");
  host_.rope = RopeTable(c.head_dim, c.rotary_dim, c.max_positions, c.rope_theta);
}

FloatsView Model::Keep(std::vector<float> values) {
  vectors_.push_back(std::make_unique<const std::vector<float>>(std::move(values)));
  return *vectors_.back();
}

const Backend& Model::backend() const {
  return backend_ != nullptr ? *backend_ : BackendNamed(DefaultBackendSpec());
}

void Model::UseBackend(const Backend& backend) { backend_ = &backend; }

namespace {

// Copies `host` weights into `backend`'s memory, each range of host bytes once (tied
// embeddings share their copy).
class WeightBinder {
 public:
  WeightBinder(const Backend& backend, ResidentWeights& out) : backend_(backend), out_(out) {}

  WeightView Matrix(const WeightView& host) {
    if (host.data == nullptr) return host;
    WeightView bound = host;
    bound.data = static_cast<const uint8_t*>(Bytes(host.data, host.Bytes()));
    return bound;
  }
  FloatsView Floats(FloatsView host) {
    if (host.empty()) return host;
    return {static_cast<const float*>(Bytes(host.data(), int64_t(host.size_bytes()))), host.size()};
  }

 private:
  // The backend's copy of [data, data + bytes): inside a copy made before when one covers it.
  const void* Bytes(const void* data, int64_t bytes) {
    const auto* begin = static_cast<const uint8_t*>(data);
    for (const auto& [host, index] : made_) {
      const Buffer& copy = out_.copies[index];
      if (begin >= host && begin + bytes <= host + copy.bytes())
        return copy.As<uint8_t>() + (begin - host);
    }
    Buffer& copy = out_.copies.emplace_back(backend_, bytes, ElementType::kU8, Buffer::Init::kNone);
    backend_.Upload(data, bytes, copy.As<uint8_t>());
    out_.bytes += bytes;
    made_.emplace_back(begin, out_.copies.size() - 1);
    return copy.As<uint8_t>();
  }

  const Backend& backend_;
  ResidentWeights& out_;
  std::vector<std::pair<const uint8_t*, size_t>> made_;  // host start, index in copies
};

}  // namespace

const ResidentWeights& Model::On(const Backend& backend) const {
  std::lock_guard lock(binding_);
  std::unique_ptr<ResidentWeights>& resident = resident_[&backend];
  if (resident) return *resident;
  resident = std::make_unique<ResidentWeights>();
  ResidentWeights& r = *resident;
  r.backend = &backend;
  if (backend.ViewsHostWeights()) {
    r.layers = host_.layers;
    r.embedding = host_.embedding;
    r.lm_head = host_.lm_head;
    r.final_norm = host_.final_norm;
    r.rope = host_.rope;
    return r;
  }
  WeightBinder bind(backend, r);
  auto swiglu = [&](const SwiGluWeights& w) {
    return SwiGluWeights{bind.Matrix(w.gate), bind.Matrix(w.up), bind.Matrix(w.down)};
  };
  for (const LayerWeights& h : host_.layers) {
    LayerWeights w;
    w.wq = bind.Matrix(h.wq);
    w.wk = bind.Matrix(h.wk);
    w.wv = bind.Matrix(h.wv);
    w.wo = bind.Matrix(h.wo);
    w.attn_norm = bind.Floats(h.attn_norm);
    w.ffn_norm = bind.Floats(h.ffn_norm);
    w.bq = bind.Floats(h.bq);
    w.bk = bind.Floats(h.bk);
    w.bv = bind.Floats(h.bv);
    w.bo = bind.Floats(h.bo);
    w.q_norm = bind.Floats(h.q_norm);
    w.k_norm = bind.Floats(h.k_norm);
    w.mlp = swiglu(h.mlp);
    w.router = bind.Matrix(h.router);
    w.expert_bias = bind.Floats(h.expert_bias);
    for (const SwiGluWeights& expert : h.experts) w.experts.push_back(swiglu(expert));
    w.shared = swiglu(h.shared);
    r.layers.push_back(std::move(w));
  }
  r.embedding = bind.Matrix(host_.embedding);
  r.lm_head = bind.Matrix(host_.lm_head);
  r.final_norm = bind.Floats(host_.final_norm);
  r.rope = host_.rope.WithAngles(bind.Floats(host_.rope.cos), bind.Floats(host_.rope.sin));
  return r;
}

int64_t Model::ParameterCount() const {
  int64_t total = 0;
  for (const auto& [name, t] : store_.tensors()) total += t.NumElements();
  return total;
}

std::unique_ptr<Model> Model::Load(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) Fail(path, ": no such file or directory");
  if (!fs::is_directory(path)) {
    if (fs::path(path).extension() == ".gguf") return LoadGgufModel(path);
    Fail(path, ": not a model folder (expected config.json and *.safetensors) or a .gguf file");
  }
  const std::string config_path = (fs::path(path) / "config.json").string();
  if (!fs::exists(config_path)) Fail(path, ": no config.json");
  const nlohmann::json raw = ReadJsonFile(config_path);
  if (!raw.is_object()) Fail(config_path, ": not a JSON object");
  const Architecture& arch = ArchitectureOfHfConfig(raw, config_path);
  const ModelConfig config = ParseHfConfig(arch, raw, config_path);
  TensorStore store = ReadSafetensorsDir(path);
  return std::make_unique<Model>(std::move(store), config, arch.hf_tensors, path);
}

}  // namespace polestar
