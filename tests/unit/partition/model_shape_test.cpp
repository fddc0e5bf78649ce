#include <gtest/gtest.h>

#include "common/error.h"
#include "partition/model_presets.h"
#include "partition/model_shape.h"

namespace shardline::partition {
namespace {

TEST(ModelShape, RejectsNonsense) {
  ModelShape good = find_model_preset("15m").shape;
  EXPECT_FALSE(good.find_problem());
  auto with = [&](auto mutate) {
    ModelShape s = good;
    mutate(s);
    return s.find_problem();
  };
  EXPECT_TRUE(with([](ModelShape& s) { s.dim = 0; }));
  EXPECT_TRUE(with([](ModelShape& s) { s.n_layers = -3; }));
  EXPECT_TRUE(with([](ModelShape& s) { s.n_heads = 7; }));      // does not divide 288
  EXPECT_TRUE(with([](ModelShape& s) { s.n_kv_heads = 4; }));   // does not divide 6 heads
  EXPECT_TRUE(with([](ModelShape& s) { s.vocab_size = 1 << 30; }));
  auto problem = with([](ModelShape& s) { s.n_kv_heads = 4; });
  EXPECT_NE(problem->find("n_kv_heads=4 does not divide n_heads=6"), std::string::npos) << *problem;
}

TEST(ModelShape, ParameterCountsMatchThePublishedModels) {
  // stories15M has 15.2M parameters (llama2.c README); TinyLlama 1.1B (unshared classifier) 1.10B.
  EXPECT_NEAR(find_model_preset("15m").shape.n_params() / 1e6, 15.2, 0.1);
  EXPECT_NEAR(find_model_preset("110m").shape.n_params() / 1e6, 109.5, 0.5);
  EXPECT_NEAR(find_model_preset("1.1b").shape.n_params() / 1e9, 1.10, 0.01);
  EXPECT_NEAR(find_model_preset("llama2-7b").shape.n_params() / 1e9, 6.74, 0.01);
}

TEST(ModelPresets, UnknownNameListsTheKnownOnes) {
  try {
    find_model_preset("gpt-5");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("110m"), std::string::npos);
  }
  for (const auto& preset : model_presets()) EXPECT_FALSE(preset.shape.find_problem()) << preset.name;
}

}  // namespace
}  // namespace shardline::partition
