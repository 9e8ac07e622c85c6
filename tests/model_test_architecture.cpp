// The architecture registry: lookups by config.json model_type and GGUF
// general.architecture, their errors, and every registered architecture's round trip
// make-random-model -> load -> convert to GGUF -> load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "base/error.h"
#include "bench/random_model.h"
#include "model/gguf_convert.h"
#include "model/model.h"
#include "test_support.h"

namespace polestar {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ArchitectureRegistry, FindsArchitecturesByModelTypeAndGgufName) {
  auto by_type = [](const char* type) {
    return ArchitectureOfHfConfig({{"model_type", type}}, "config.json").name;
  };
  EXPECT_EQ(by_type("llada"), "llada");
  EXPECT_EQ(by_type("Dream"), "dream");
  EXPECT_EQ(by_type("dream"), "dream");
  EXPECT_EQ(ArchitectureOfGguf("llada", "x.gguf").name, "llada");
  EXPECT_EQ(ArchitectureOfGguf("dream", "x.gguf").name, "dream");
  for (const Architecture* arch : Architectures()) {
    EXPECT_EQ(&ArchitectureOfGguf(arch->name, "x.gguf"), arch);
    for (const std::string& type : arch->model_types)
      EXPECT_EQ(&ArchitectureOfHfConfig({{"model_type", type}}, "config.json"), arch);
  }
}

TEST(ArchitectureRegistry, UnknownNamesListTheRegisteredOnes) {
  EXPECT_EQ(ErrorOf([] {
              ArchitectureOfHfConfig({{"model_type", "gpt2"}}, "c.json");
            }),
            "c.json: unknown model_type 'gpt2' (supported: llada, Dream, lladamoe, llada2_moe)");
  EXPECT_EQ(ErrorOf([] {
              ArchitectureOfHfConfig({{"model_type", 5}}, "c.json");
            }),
            "c.json: no model_type string (supported: llada, Dream, lladamoe, llada2_moe)");
  EXPECT_EQ(ErrorOf([] { ArchitectureOfHfConfig(nlohmann::json::object(), "c.json"); }),
            "c.json: no model_type string (supported: llada, Dream, lladamoe, llada2_moe)");
  // Case matters: Dream's own configs say "Dream", llama.cpp's GGUF files "dream".
  EXPECT_THAT(ErrorOf([] {
                ArchitectureOfHfConfig({{"model_type", "LLaDA"}}, "c.json");
              }),
              HasSubstr("unknown model_type 'LLaDA'"));
  EXPECT_EQ(
      ErrorOf([] { ArchitectureOfGguf("qwen2", "x.gguf"); }),
      "x.gguf: general.architecture 'qwen2' is not supported (llada, dream, llada-moe, llada2)");
}

TEST(ArchitectureRegistry, NamesModelTypesAndShapesAreUnique) {
  std::set<std::string> names, types, shapes;
  for (const Architecture* arch : Architectures()) {
    EXPECT_TRUE(names.insert(arch->name).second) << arch->name;
    EXPECT_FALSE(arch->model_types.empty()) << arch->name;
    for (const std::string& type : arch->model_types) EXPECT_TRUE(types.insert(type).second);
    EXPECT_FALSE(arch->random_shapes.empty()) << arch->name << " has no make-random-model shape";
    for (const CheckpointShape& shape : arch->random_shapes)
      EXPECT_TRUE(shapes.insert(shape.name).second) << shape.name;
  }
  EXPECT_EQ(bench::KnownShapes().size(), shapes.size());
  for (const bench::ModelShape& shape : bench::KnownShapes())
    EXPECT_TRUE(shapes.contains(shape.name)) << shape.name;
  EXPECT_EQ(bench::ShapeByName("dream-tiny").arch, &ArchitectureOfGguf("dream", ""));
  EXPECT_THAT(ErrorOf([] { bench::ShapeByName("gpt2-tiny"); }),
              HasSubstr("(known: llada-8b, llada-1b, llada-tiny, dream-7b, dream-tiny, "
                        "llada-moe-7b-a1b, llada-moe-tiny, llada2-mini, llada2-tiny)"));
}

// What each architecture's checkpoints decode with, from its model card and llama.cpp's
// converter; a new architecture adds its row.
struct Expected {
  bool qkv_bias;               // in its random (and real) checkpoints
  bool shift_logits;           // output row p predicts position p + 1
  bool gguf_rope_interleaved;  // llama.cpp's converter permutes q/k rows
  SamplerFamily sampler;
};
const std::map<std::string, Expected>& ExpectedBehaviour() {
  static const std::map<std::string, Expected> expected = {
      {"llada", {false, false, true, SamplerFamily::kLlada}},
      {"dream", {true, true, false, SamplerFamily::kDream}},
      {"llada-moe", {false, false, false, SamplerFamily::kLlada}},
      {"llada2", {false, false, false, SamplerFamily::kLlada2}},
  };
  return expected;
}

// The smallest make-random-model shape of the architecture.
bench::ModelShape SmallestShape(const Architecture& arch) {
  const CheckpointShape* smallest = &arch.random_shapes.front();
  for (const CheckpointShape& shape : arch.random_shapes) {
    if (int64_t(shape.vocab) * shape.width * shape.layers <
        int64_t(smallest->vocab) * smallest->width * smallest->layers)
      smallest = &shape;
  }
  return {*smallest, &arch};
}

// Parameterised by name, so test names read "llada", "dream", "llada_moe".
class EveryArchitecture : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> RegisteredNames() {
  std::vector<std::string> names;
  for (const Architecture* arch : Architectures()) names.push_back(arch->name);
  return names;
}

TEST_P(EveryArchitecture, RoundTripsRandomCheckpointThroughGguf) {
  const Architecture& arch = ArchitectureOfGguf(GetParam(), "registry");
  ASSERT_TRUE(ExpectedBehaviour().contains(arch.name)) << "add " << arch.name << " to the table";
  const Expected& want = ExpectedBehaviour().at(arch.name);
  const std::string dir = testing::TempDir();
  bench::RandomModelOptions options;
  options.shape = SmallestShape(arch);
  options.dtype = DType::kF32;
  bench::WriteRandomModel(dir + "/hf", options);
  auto hf = Model::Load(dir + "/hf");
  EXPECT_EQ(hf->config().sampler, want.sampler);
  ConvertToGguf(dir + "/hf", dir + "/model.gguf", GgufFileType::kF16);
  auto gguf = Model::Load(dir + "/model.gguf");

  const ModelConfig& a = hf->config();
  const ModelConfig& b = gguf->config();
  const bench::ModelShape& s = options.shape;
  EXPECT_EQ(a.arch, &arch);
  EXPECT_EQ(b.arch, &arch);
  EXPECT_EQ(std::tie(a.vocab, a.width, a.layers, a.heads, a.kv_heads, a.ffn, a.max_positions,
                     a.mask_id, a.eos_id, a.bos_id, a.eot_id),
            std::tie(s.vocab, s.width, s.layers, s.heads, s.kv_heads, s.ffn, s.max_positions,
                     s.mask_id, s.eos_id, s.bos_id, s.eot_id));
  EXPECT_EQ(a.rope_theta, s.rope_theta);
  EXPECT_EQ(std::tie(a.vocab, a.width, a.layers, a.heads, a.kv_heads, a.head_dim, a.ffn, a.rms_eps,
                     a.rope_theta, a.max_positions, a.mask_id, a.eos_id, a.pad_id, a.bos_id,
                     a.eot_id, a.qkv_bias, a.tied_embeddings, a.shift_logits, a.sampler),
            std::tie(b.vocab, b.width, b.layers, b.heads, b.kv_heads, b.head_dim, b.ffn, b.rms_eps,
                     b.rope_theta, b.max_positions, b.mask_id, b.eos_id, b.pad_id, b.bos_id,
                     b.eot_id, b.qkv_bias, b.tied_embeddings, b.shift_logits, b.sampler));
  EXPECT_EQ(a.qkv_bias, want.qkv_bias);
  EXPECT_EQ(a.shift_logits, want.shift_logits);
  EXPECT_EQ(a.sampler, want.sampler);
  EXPECT_FALSE(a.rope_interleaved);  // Hugging Face checkpoints rotate halves
  EXPECT_EQ(b.rope_interleaved, want.gguf_rope_interleaved);
  EXPECT_EQ(std::tie(a.qk_norm, a.o_bias, a.clip_qkv, a.rotary_dim, a.moe.experts,
                     a.moe.experts_per_token, a.moe.expert_ffn, a.moe.shared_ffn, a.moe.expert_bias,
                     a.moe.moe_layers),
            std::tie(b.qk_norm, b.o_bias, b.clip_qkv, b.rotary_dim, b.moe.experts,
                     b.moe.experts_per_token, b.moe.expert_ffn, b.moe.shared_ffn, b.moe.expert_bias,
                     b.moe.moe_layers));
  // The router's rule (LLaDA 2.x: sigmoid, groups, renormalised and scaled, its bias only
  // selecting) survives the GGUF form.
  EXPECT_EQ(std::tie(a.moe.score, a.moe.bias_in_weights, a.moe.groups, a.moe.top_groups,
                     a.moe.normalize_top_k, a.moe.routed_scaling),
            std::tie(b.moe.score, b.moe.bias_in_weights, b.moe.groups, b.moe.top_groups,
                     b.moe.normalize_top_k, b.moe.routed_scaling));
  EXPECT_EQ(a.moe.experts, s.experts);
  EXPECT_EQ(hf->ParameterCount(), gguf->ParameterCount());
  // The same tensors, but llama.cpp stacks each layer's experts into one tensor per matrix.
  EXPECT_EQ(hf->tensors().tensors().size(), CheckpointTensors(a, arch.hf_tensors).size());
  EXPECT_EQ(gguf->tensors().tensors().size(), CheckpointTensors(b, arch.gguf_tensors).size());
  if (a.moe.experts > 0) {
    EXPECT_LT(gguf->tensors().tensors().size(), hf->tensors().tensors().size());
  } else {
    EXPECT_EQ(gguf->tensors().tensors().size(), hf->tensors().tensors().size());
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryArchitecture, ::testing::ValuesIn(RegisteredNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace polestar
