#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "partition/model_presets.h"
#include "runtime/checkpoint.h"
#include "runtime/model_generator.h"
#include "tests/support/llama2c_export.h"

namespace shardline::runtime {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("checkpoint_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    shape_.dim = 32;
    shape_.hidden_dim = 70;
    shape_.n_layers = 2;
    shape_.n_heads = 4;
    shape_.n_kv_heads = 2;
    shape_.vocab_size = 300;
    shape_.seq_len = 16;
    shape_.shared_classifier = false;
    model_ = (dir_ / "m.bin").string();
    generate_model(shape_, 7, {model_, (dir_ / "m.tokenizer.bin").string()});
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_variant(const std::string& name, std::int64_t size_delta, const std::int32_t* header = nullptr) {
    std::ifstream in(model_, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    if (size_delta < 0) bytes.resize(bytes.size() + size_delta);
    if (size_delta > 0) bytes.insert(bytes.end(), size_delta, '\0');
    if (header) std::copy_n(reinterpret_cast<const char*>(header), 28, bytes.begin());
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }

  std::string error_of(const std::string& path) {
    try {
      read_checkpoint_shape(path);
    } catch (const FormatError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  partition::ModelShape shape_;
  std::string model_;
};

TEST_F(CheckpointTest, GeneratedModelRoundTripsItsShape) {
  EXPECT_EQ(read_checkpoint_shape(model_), shape_);
  EXPECT_EQ(fs::file_size(model_), checkpoint_layout(shape_).total_bytes);
}

TEST_F(CheckpointTest, LayoutMatchesTheDocumentedOrder) {
  const CheckpointLayout at = checkpoint_layout(shape_);
  EXPECT_EQ(at.token_embedding.offset, 28u);
  ASSERT_EQ(at.layers.size(), 2u);
  // Each kind stacked over the 2 layers: layer 1's follows layer 0's.
  EXPECT_EQ(at.layers[0].rms_att.offset, 28u + 4u * 300 * 32);
  EXPECT_EQ(at.layers[1].rms_att.offset - at.layers[0].rms_att.offset, 4u * 32);
  EXPECT_EQ(at.layers[0].wq.offset - at.layers[0].rms_att.offset, 4u * 2 * 32);
  EXPECT_EQ(at.layers[1].wq.offset - at.layers[0].wq.offset, 4u * 32 * 32);
  EXPECT_EQ(at.layers[0].wk.offset - at.layers[0].wq.offset, 4u * 2 * 32 * 32);
  EXPECT_EQ(at.layers[1].wk.offset - at.layers[0].wk.offset, 4u * 16 * 32);  // kv_dim = 2 heads * 8
  EXPECT_EQ(at.layers[0].wv.offset - at.layers[0].wk.offset, 4u * 2 * 16 * 32);
  EXPECT_EQ(at.layers[1].w3.offset + 4u * 70 * 32, at.rms_final.offset);  // hidden 70
  EXPECT_EQ(at.classifier.offset - at.rms_final.offset, 4u * 32 + 4u * 2 * 16 * 4);  // then 2 RoPE tables (seq 16, head_size/2 = 4)
  shape_.shared_classifier = true;
  EXPECT_EQ(checkpoint_layout(shape_).classifier, checkpoint_layout(shape_).token_embedding);
  EXPECT_TRUE(at.all_f32());
}

TEST_F(CheckpointTest, TruncatedFileIsAFormatErrorNamingBothSizes) {
  const std::string message = error_of(write_variant("short.bin", -4));
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(checkpoint_layout(shape_).total_bytes)), std::string::npos) << message;
  EXPECT_NE(error_of(write_variant("long.bin", 12)).find("longer than its header"), std::string::npos);
  EXPECT_NE(error_of(write_variant("tiny.bin", -static_cast<std::int64_t>(fs::file_size(model_)) + 10))
                .find("shorter than the 28-byte header"),
            std::string::npos);
}

TEST_F(CheckpointTest, NonsenseHeadersAreFormatErrors) {
  const std::int32_t zero_dim[7] = {0, 70, 2, 4, 2, 300, 16};
  const std::int32_t negative_layers[7] = {32, 70, -2, 4, 2, 300, 16};
  const std::int32_t heads_not_dividing_dim[7] = {32, 70, 2, 5, 5, 300, 16};
  const std::int32_t kv_not_dividing_heads[7] = {32, 70, 2, 4, 3, 300, 16};
  EXPECT_NE(error_of(write_variant("a.bin", 0, zero_dim)).find("positive"), std::string::npos);
  EXPECT_NE(error_of(write_variant("b.bin", 0, negative_layers)).find("positive"), std::string::npos);
  EXPECT_NE(error_of(write_variant("c.bin", 0, heads_not_dividing_dim)).find("n_heads=5 does not divide dim=32"),
            std::string::npos);
  EXPECT_NE(error_of(write_variant("d.bin", 0, kv_not_dividing_heads)).find("n_kv_heads=3 does not divide"),
            std::string::npos);
  // A negative vocabulary means an unshared classifier; INT_MIN has no positive counterpart (negating it was
  // undefined behaviour, which a sanitizer build flagged) and stays a negative size.
  const std::int32_t min_vocab[7] = {32, 70, 2, 4, 2, std::numeric_limits<std::int32_t>::min(), 16};
  EXPECT_NE(error_of(write_variant("e.bin", 0, min_vocab)).find("vocab -2147483648"), std::string::npos)
      << error_of(write_variant("e.bin", 0, min_vocab));
}

TEST_F(CheckpointTest, VersionedExportsPlaceTheirTensorsAsExportPyWritesThem) {
  const std::string v1 = (dir_ / "v1.bin").string(), v2 = (dir_ / "v2.bin").string();
  test::write_llama2c_export(model_, v1, {.version = 1});
  ASSERT_EQ(test::write_llama2c_export(model_, v2, {.version = 2}), 32);  // 64 halved to divide dim 32
  const std::uint64_t d = 32, L = 2, h = 70, kv = 16, v = 300, f = 4;
  const ModelFile one = read_model_file(v1);
  EXPECT_EQ(one.llama2c_version, 1);
  EXPECT_EQ(one.shape, shape_);
  EXPECT_TRUE(one.layout.all_f32());
  // The norms first, then the embedding and each kind of matrix for every layer.
  EXPECT_EQ(one.layout.layers[1].rms_att.offset, 256 + d * f);
  EXPECT_EQ(one.layout.layers[0].rms_ffn.offset, 256 + L * d * f);
  EXPECT_EQ(one.layout.token_embedding.offset, 256 + (2 * L + 1) * d * f);
  EXPECT_EQ(one.layout.layers[1].wq.offset, one.layout.token_embedding.offset + (v * d + d * d) * f);
  EXPECT_EQ(one.layout.classifier.offset, one.layout.total_bytes - v * d * f);

  const ModelFile two = read_model_file(v2);
  EXPECT_EQ(two.llama2c_version, 2);
  EXPECT_EQ(two.shape, shape_);
  EXPECT_FALSE(two.layout.all_f32());
  EXPECT_EQ(two.layout.layers[1].rms_ffn, (TensorRef{256 + (L + 1) * d * f}));
  // Each layer's matrix: its int8 values, then one fp32 scale per 32 of them.
  const TensorRef w2 = two.layout.layers[1].w2;
  EXPECT_EQ(w2.element, TensorElement::kLlama2cQ8);
  EXPECT_EQ(w2.group, 32u);
  EXPECT_EQ(w2.scales, w2.offset + d * h);
  EXPECT_EQ(two.layout.layers[0].w2.scales + d * h / 32 * f, w2.offset);
  EXPECT_EQ(two.layout.layers[1].w1.offset, two.layout.layers[0].w1.scales + h * d / 32 * f);
  EXPECT_EQ(two.layout.layers[0].wk.offset, two.layout.layers[1].wq.scales + d * d / 32 * f);
  EXPECT_EQ(two.layout.layers[0].wv.offset, two.layout.layers[1].wk.scales + kv * d / 32 * f);
  // A slice starts inside the tensor (and here inside a group: rows of 70 values, groups of 32).
  const TensorRef row1 = w2.at(h);
  EXPECT_EQ(row1.offset, w2.offset + h);
  EXPECT_EQ(row1.first, h);
  EXPECT_EQ(row1.scales, w2.scales);
  EXPECT_DOUBLE_EQ(bits_per_weight(w2), 9.0);
  EXPECT_EQ(two.layout.classifier.scales + v * d / 32 * f, two.layout.total_bytes);
}

TEST_F(CheckpointTest, MissingFileIsAResourceError) {
  EXPECT_THROW(read_checkpoint_shape((dir_ / "nope.bin").string()), ResourceError);
}

TEST_F(CheckpointTest, GenerationIsDeterministic) {
  const std::string again = (dir_ / "again.bin").string();
  generate_model(shape_, 7, {again, (dir_ / "again.tok").string()});
  std::ifstream a(model_, std::ios::binary), b(again, std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));
}

}  // namespace
}  // namespace shardline::runtime
