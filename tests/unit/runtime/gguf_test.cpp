// GGUF model files: the llama.cpp-written files in shared/models hold exactly the llama2.c checkpoints'
// tensors and vocabulary; a converted model of another shape, with its tensors in any order and alignment,
// reads back as its checkpoint; and every corruption is a FormatError naming what is wrong, never a crash.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/mapped_file.h"
#include "runtime/checkpoint.h"
#include "runtime/gguf.h"
#include "runtime/gguf_model.h"
#include "runtime/model_generator.h"
#include "runtime/tokenizer.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

namespace fs = std::filesystem;
using test::GgufWriter;
using test::LlamaGgufOptions;
using test::llama_gguf_from_llama2c;
using test::model_file;

std::vector<char> file_bytes(const std::string& path, std::uint64_t offset, std::uint64_t bytes) {
  std::vector<char> data(bytes);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  EXPECT_TRUE(in) << path << " at " << offset;
  return data;
}

// Every tensor of the two files, byte for byte (the GGUF classifier against the checkpoint's, tied or not).
void expect_same_tensors(const std::string& gguf, const std::string& checkpoint) {
  const ModelFile g = read_model_file(gguf), c = read_model_file(checkpoint);
  const partition::ModelShape& s = c.shape;
  const std::uint64_t d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  auto same = [&](TensorRef at_g, TensorRef at_c, std::uint64_t floats, const std::string& what) {
    EXPECT_EQ(at_g.element, TensorElement::kF32) << what;
    EXPECT_EQ(file_bytes(gguf, at_g.offset, floats * 4), file_bytes(checkpoint, at_c.offset, floats * 4))
        << gguf << ": " << what;
  };
  same(g.layout.token_embedding, c.layout.token_embedding, v * d, "token embedding");
  same(g.layout.classifier, c.layout.classifier, v * d, "classifier");
  same(g.layout.rms_final, c.layout.rms_final, d, "final norm");
  ASSERT_EQ(g.layout.layers.size(), c.layout.layers.size());
  for (std::size_t l = 0; l < c.layout.layers.size(); ++l) {
    const LayerTensors &a = g.layout.layers[l], &b = c.layout.layers[l];
    const std::string layer = "layer " + std::to_string(l) + " ";
    same(a.rms_att, b.rms_att, d, layer + "rms_att");
    same(a.wq, b.wq, d * d, layer + "wq");
    same(a.wk, b.wk, kv * d, layer + "wk");
    same(a.wv, b.wv, kv * d, layer + "wv");
    same(a.wo, b.wo, d * d, layer + "wo");
    same(a.rms_ffn, b.rms_ffn, d, layer + "rms_ffn");
    same(a.w1, b.w1, h * d, layer + "w1");
    same(a.w2, b.w2, d * h, layer + "w2");
    same(a.w3, b.w3, h * d, layer + "w3");
  }
}

TEST(Gguf, LlamaCppFilesHoldTheCheckpointsTensorsAsTheyAre) {
  // llama.cpp's llama2c converter neither permutes q and k nor reorders anything: the same bytes.
  for (const std::string name : {"tiny-32k", "mini-gqa"}) {
    SHARDLINE_REQUIRE_MODEL_FILE(model_file(name + ".gguf"));
    SHARDLINE_REQUIRE_MODEL_FILE(model_file(name + ".bin"));
    const ModelFile g = read_model_file(model_file(name + ".gguf"));
    partition::ModelShape expected = read_checkpoint_shape(model_file(name + ".bin"));
    EXPECT_EQ(g.format, ModelFormat::kGguf);
    expected.seq_len = 128;               // the converter's context length
    expected.shared_classifier = false;   // it writes output.weight even for a tied classifier
    EXPECT_EQ(g.shape, expected) << g.shape.describe();
    EXPECT_FLOAT_EQ(g.rms_eps, 1e-5f);
    EXPECT_FLOAT_EQ(g.rope_theta, 10000.0f);
    expect_same_tensors(model_file(name + ".gguf"), model_file(name + ".bin"));
  }
}

TEST(Gguf, VocabularyIsTheTokenizerBinOne) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.gguf"));
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tokenizer.bin"));
  const Tokenizer from_gguf(model_file("mini-gqa.gguf"), 32000), from_bin(model_file("tokenizer.bin"), 32000);
  for (int id = 0; id < 32000; ++id) {
    ASSERT_EQ(from_gguf.piece(id), from_bin.piece(id)) << id;
    ASSERT_EQ(from_gguf.score(id), from_bin.score(id)) << id;
  }
  for (const char* text : {"Once upon a time", "The cluster has eight nodes", "naïve café 東京 🚀", ""}) {
    EXPECT_EQ(from_gguf.encode(text, true, false), from_bin.encode(text, true, false)) << text;
  }
  // Where llama.cpp's prompts part from run.c's (ids from an independent model of llama.cpp's tokenizer): a
  // typed U+2581 is a space to it, and a byte that is not UTF-8 takes as many bytes as it announces.
  using Ids = std::vector<int>;
  EXPECT_EQ(from_gguf.encode("a\u2581b \u2581x", true, false), (Ids{1, 263, 289, 29871, 921}));
  EXPECT_EQ(from_gguf.encode("a\x80" "b", true, false), (Ids{1, 263, 131, 29890}));
  EXPECT_EQ(from_bin.encode("a\x80" "b", true, false), (Ids{1, 29871, 100, 131, 29890}));  // run.c's
  EXPECT_EQ(from_gguf.encode("\xe4" "ab", true, false), (Ids{1, 29871, 231, 100, 101}));
  EXPECT_EQ(from_gguf.encode("Hello world <s>x", true, false), (Ids{1, 15043, 3186, 29871, 1, 921}));
  EXPECT_THROW(Tokenizer(model_file("mini-gqa.gguf"), 31999), FormatError);
}

class GeneratedGguf : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("gguf_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // A shape the reference files do not have: GQA 6/2, head size 20, hidden not a multiple of 32, tied.
    shape_ = {.dim = 120, .hidden_dim = 250, .n_layers = 3, .n_heads = 6, .n_kv_heads = 2, .vocab_size = 301,
              .seq_len = 48, .shared_classifier = true};
    paths_ = {(dir_ / "m.bin").string(), (dir_ / "m.tokenizer.bin").string()};
    generate_model(shape_, 5, paths_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A valid GGUF of the generated model, written to name.
  std::string write(const std::string& name, const LlamaGgufOptions& options = {}) {
    llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, options).write(path(name), options.alignment);
    return path(name);
  }
  // The error of the generated model's GGUF with one edit made to it (none: "no FormatError").
  template <typename Edit>
  std::string error_with(Edit&& edit) {
    GgufWriter w = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer);
    edit(w);
    w.write(path("edited.gguf"));
    return error_of(path("edited.gguf"));
  }
  static std::string error_of(const std::string& file) {
    try {
      read_model_file(file);
    } catch (const FormatError& e) {
      return e.what();
    }
    return "no FormatError";
  }

  fs::path dir_;
  partition::ModelShape shape_;
  GeneratedModelPaths paths_;
};

TEST_F(GeneratedGguf, AnyTensorOrderAndAlignmentReadsBackAsTheCheckpoint) {
  for (const LlamaGgufOptions& options : {LlamaGgufOptions{}, LlamaGgufOptions{.alignment = 64, .shuffle_seed = 7},
                                          LlamaGgufOptions{.alignment = 4096, .shuffle_seed = 11, .write_output = false}}) {
    const std::string file = write("m.gguf", options);
    const ModelFile g = read_model_file(file);
    partition::ModelShape expected = shape_;
    expected.shared_classifier = !options.write_output;
    EXPECT_EQ(g.shape, expected) << g.shape.describe();
    expect_same_tensors(file, paths_.model);
    const Tokenizer from_gguf(file, shape_.vocab_size), from_bin(paths_.tokenizer, shape_.vocab_size);
    for (int id = 0; id < shape_.vocab_size; ++id) ASSERT_EQ(from_gguf.piece(id), from_bin.piece(id)) << id;
  }
}

TEST_F(GeneratedGguf, ASentencePieceVocabularyIsUsedAsLlamaCppUsesIt) {
  // llama.cpp wrote the file, so its prompts parse special tokens written in them, each stretch of text
  // between them merges on its own with the dummy prefix at the start and after a special, and generation
  // ends at EOS; tokenizer.bin (llama2.c) keeps run.c's conventions for the same pieces.
  const Tokenizer bin(paths_.tokenizer, 301), gguf(write("v.gguf"), 301);
  auto text = [&](const std::string& t) { return bin.encode(t, false, false); };  // with run.c's dummy prefix
  auto join = [](std::initializer_list<std::vector<int>> parts) {
    std::vector<int> all;
    for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
    return all;
  };
  for (const char* plain : {"hat the rain", "", " ", "a  b\n"}) {
    EXPECT_EQ(gguf.encode(plain, true, false), bin.encode(plain, true, false)) << plain;
  }
  EXPECT_EQ(gguf.encode("hi</s>the <unk>a", true, false),
            join({{kBosId}, text("hi"), {kEosId}, text("the "), {kUnkId}, text("a")}));
  EXPECT_EQ(bin.encode("hi</s>", true, false), join({{kBosId}, text("hi</s>")}));  // llama2.c: text
  EXPECT_EQ(gguf.encode("<s>hi", true, false), join({{kBosId}, text("hi")}));      // one BOS, not two
  EXPECT_EQ(gguf.encode("</s>", true, false), (std::vector<int>{kBosId, kEosId}));
  EXPECT_EQ(gguf.encode("hi", true, true), join({{kBosId}, text("hi"), {kEosId}}));
  // Control and unknown tokens print nothing; the rest decode as llama2.c's.
  for (const int id : {kUnkId, kBosId, kEosId}) EXPECT_EQ(gguf.decode(kBosId, id), "") << id;
  for (const int id : {kByteFallbackId + 'x', bin.lookup(" "), 300}) {
    EXPECT_EQ(gguf.decode(kBosId, id), bin.decode(kBosId, id)) << id;
    EXPECT_EQ(gguf.decode(7, id), bin.decode(7, id)) << id;
  }
  EXPECT_EQ(bin.end_ids(), (std::vector<int>{kBosId}));
  EXPECT_EQ(gguf.end_ids(), (std::vector<int>{kEosId}));
  EXPECT_EQ(gguf.end_description(), "an end-of-text token: '</s>'");
  EXPECT_EQ(gguf.bos_id(), kBosId);

  // The file's own keys: an EOT id ends generation too; no BOS, no dummy prefix when the file says so.
  const Tokenizer eot(write("eot.gguf", {.eot_token_id = 300}), 301);
  EXPECT_EQ(eot.end_ids(), (std::vector<int>{kEosId, 300}));
  EXPECT_EQ(eot.end_description(), fmt::format("an end-of-text token: '</s>' or '{}'", bin.piece(300)));
  const Tokenizer no_bos(write("nobos.gguf", {.add_bos_token = false}), 301);
  EXPECT_EQ(no_bos.encode("hi", true, false), text("hi"));
  EXPECT_EQ(no_bos.bos_id(), -1);
  const Tokenizer no_prefix(write("noprefix.gguf", {.add_space_prefix = false}), 301);
  // (This small vocabulary has no "h", "i" or "hi": byte tokens, where the prefix would add " ".)
  ASSERT_EQ(text("hi"), (std::vector<int>{bin.lookup(" "), kByteFallbackId + 'h', kByteFallbackId + 'i'}));
  EXPECT_EQ(no_prefix.encode("hi", true, false), (std::vector<int>{kBosId, kByteFallbackId + 'h', kByteFallbackId + 'i'}));
  EXPECT_EQ(no_prefix.encode("</s>i", true, false), (std::vector<int>{kBosId, kEosId, kByteFallbackId + 'i'}));
  // Without token types nothing is special (as llama.cpp reads such a file): the text stays text.
  const Tokenizer untyped(write("untyped.gguf", {.token_types = false}), 301);
  EXPECT_EQ(untyped.encode("hi</s>", true, false), bin.encode("hi</s>", true, false));
  EXPECT_EQ(untyped.end_ids(), (std::vector<int>{kEosId}));
}

TEST_F(GeneratedGguf, F16AndBf16MatricesAreReadAsTheirTypeNormsStayF32) {
  for (const std::uint32_t type : {1u, 30u}) {
    const ModelFile g = read_model_file(write("h.gguf", {.matrix_type = type}));
    const TensorElement expected = type == 1 ? TensorElement::kF16 : TensorElement::kBF16;
    EXPECT_EQ(g.layout.token_embedding.element, expected);
    EXPECT_EQ(g.layout.classifier.element, expected);
    EXPECT_EQ(g.layout.layers[2].w2.element, expected);
    EXPECT_EQ(g.layout.layers[2].rms_ffn.element, TensorElement::kF32);
    EXPECT_FALSE(g.layout.all_f32());
    // Element i of a narrow tensor is 2 i bytes in.
    EXPECT_EQ(g.layout.layers[0].wq.at(5).offset, g.layout.layers[0].wq.offset + 10);
  }
}

TEST_F(GeneratedGguf, EveryTruncationIsAFormatError) {
  const std::string good = write("good.gguf");
  const std::uint64_t size = fs::file_size(good);
  const std::vector<char> bytes = file_bytes(good, 0, size);
  // Through the header, the metadata, the tensor table and the data.
  for (const std::uint64_t cut : std::vector<std::uint64_t>{4, 23, 30, 200, 3000, 9000, size / 3, size / 2, size - 4096, size - 1}) {
    std::ofstream(path("cut.gguf"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    const std::string message = error_of(path("cut.gguf"));
    EXPECT_NE(message.find("cut.gguf"), std::string::npos) << cut << ": " << message;
    EXPECT_TRUE(message.find("corrupt") != std::string::npos || message.find("truncated") != std::string::npos ||
                message.find("shorter") != std::string::npos)
        << cut << ": " << message;
  }
}

TEST_F(GeneratedGguf, MalformedContainersAreFormatErrors) {
  std::vector<char> bytes = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer).bytes();
  auto with = [&](std::size_t at, const void* value, std::size_t n) {
    std::vector<char> b = bytes;
    std::memcpy(b.data() + at, value, n);
    std::ofstream(path("bad.gguf"), std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return error_of(path("bad.gguf"));
  };
  const std::uint32_t version1 = 1;
  EXPECT_NE(with(4, &version1, 4).find("version 1"), std::string::npos);
  const std::uint64_t huge = 1ull << 60;
  EXPECT_NE(with(8, &huge, 8).find("is no model"), std::string::npos);   // tensor count
  EXPECT_NE(with(24, &huge, 8).find("runs past the end"), std::string::npos);  // the first key's length
  // The first key is general.architecture (a string): its value's length.
  const std::size_t first_value_length = 24 + 8 + std::strlen("general.architecture") + 4;
  EXPECT_NE(with(first_value_length, &huge, 8).find("runs past the end"), std::string::npos);
  EXPECT_NE(with(first_value_length, &huge, 8).find("(the value of metadata key 'general.architecture', 1 of "),
            std::string::npos) << with(first_value_length, &huge, 8);
  // A key count of 0 reads the first key as a tensor: the error says where the reading was.
  const std::uint64_t no_keys = 0;
  EXPECT_NE(with(16, &no_keys, 8).find("(tensor info 1 of the "), std::string::npos) << with(16, &no_keys, 8);
  EXPECT_NE(with(16, &no_keys, 8).find("after its 0 metadata keys)"), std::string::npos) << with(16, &no_keys, 8);
}

TEST_F(GeneratedGguf, ForgedFieldsAreRefusedByName) {
  // (From a fuzzing pass: each of these once ran, or printed the file's bytes raw.)
  const std::vector<char> good = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer).bytes();
  auto save = [&](const std::vector<char>& b) {
    std::ofstream(path("f.gguf"), std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return error_of(path("f.gguf"));
  };
  // A tensor's offset pointed into another tensor's bytes.
  std::string text(good.begin(), good.end());
  const std::string name = "blk.0.attn_v.weight";
  const std::size_t offset_field = text.find(name) + name.size() + 4 + 2 * 8 + 4;
  std::vector<char> overlapping = good;
  std::memset(overlapping.data() + offset_field, 0, 8);  // data offset 0: token_embd's
  const std::string overlap = save(overlapping);
  EXPECT_NE(overlap.find("overlap"), std::string::npos) << overlap;
  EXPECT_NE(overlap.find("'token_embd.weight'"), std::string::npos) << overlap;
  EXPECT_NE(overlap.find("'blk.0.attn_v.weight'"), std::string::npos) << overlap;
  // An offset off the alignment says so (it was once reported as lying outside the file).
  std::vector<char> misaligned = good;
  const std::uint64_t one = 1;
  std::memcpy(misaligned.data() + offset_field, &one, 8);
  const std::string off = save(misaligned);
  EXPECT_NE(off.find("tensor 'blk.0.attn_v.weight' starts at data offset 1, which is not a multiple of the file's "
                     "alignment of 32 bytes"),
            std::string::npos)
      << off;
  // A tensor's type changed from F32 to F16 left half its bytes unused: the model once ran on them.
  std::vector<char> retyped = good;
  const std::uint32_t f16 = 1;
  std::memcpy(retyped.data() + offset_field - 4, &f16, 4);
  const std::string gap = save(retyped);
  EXPECT_NE(gap.find("tensor 'blk.0.attn_v.weight' (F16, "), std::string::npos) << gap;
  EXPECT_NE(gap.find("a tensor's type or shape does not match its data"), std::string::npos) << gap;
  // 32 bytes between the tensor table and the data (from a fuzzing pass): every tensor was read 32 bytes
  // early, the last 32 bytes of the file never, and the model ran on, printing garbage.
  const std::string good_file = write("shift-source.gguf");
  std::uint64_t data_start = std::numeric_limits<std::uint64_t>::max();
  const GgufFile source(good_file);
  for (const auto& [tensor_name, tensor] : source.tensors()) data_start = std::min(data_start, tensor.offset);
  std::vector<char> shifted = good;
  shifted.insert(shifted.begin() + static_cast<std::ptrdiff_t>(data_start), 32, '\0');
  const std::string late = save(shifted);
  EXPECT_NE(late.find("ends at byte"), std::string::npos) << late;
  EXPECT_NE(late.find("the tensor data does not start where the tensor table says"), std::string::npos) << late;
  // A type whose layout this reader does not know (IQ4_XS: 136 bytes per 256 values) has an unknown end,
  // so the tensor after it is not held to one; an empty tensor takes no bytes.
  GgufWriter unknown;
  unknown.tensor("iq4.weight", {256, 2}, 23, std::vector<char>(2 * 136));
  unknown.tensor("empty.weight", {0, 4}, 0, {});
  unknown.tensor("after.weight", {8}, 0, std::vector<char>(32));
  unknown.write(path("iq4.gguf"));
  EXPECT_NO_THROW(GgufFile{path("iq4.gguf")});
  // Constants out of range, reported as the file gives them.
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.rms_eps = std::numeric_limits<float>::infinity()})
      .write(path("eps.gguf"));
  EXPECT_NE(error_of(path("eps.gguf")).find("layer_norm_rms_epsilon inf is not in"), std::string::npos)
      << error_of(path("eps.gguf"));
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.rope_freq_base = 0.5}).write(path("theta.gguf"));
  EXPECT_NE(error_of(path("theta.gguf")).find("rope.freq_base 0.5 is not in [1, 1e12]"), std::string::npos);
  // Llama 3.1's RoPE divisors come through as the file holds them.
  const std::vector<float> divisors = {1, 1, 2, 2, 4, 4, 8, 8, 8, 8};
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.rope_freqs = divisors}).write(path("freqs.gguf"));
  EXPECT_EQ(read_model_file(path("freqs.gguf")).rope_freq_divisors, divisors);
  // Written with a trailing 1 in ne ([10, 1]), as some writers keep it: the same tensor.
  GgufWriter trailing = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer);
  std::vector<char> bytes(divisors.size() * sizeof(float));
  std::memcpy(bytes.data(), divisors.data(), bytes.size());
  trailing.tensor("rope_freqs.weight", {divisors.size(), 1}, 0, bytes);
  trailing.write(path("freqs1.gguf"));
  EXPECT_EQ(read_model_file(path("freqs1.gguf")).rope_freq_divisors, divisors);
  // An alignment that would leave F32 tensors misaligned.
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.alignment = 2}).write(path("a2.gguf"), 2);
  EXPECT_NE(error_of(path("a2.gguf")).find("general.alignment 2 is not a power of two from 8 to 1 MiB"), std::string::npos);
  // A name with control bytes is printed escaped, on one line.
  GgufWriter ctrl;
  ctrl.tensor("bad\n\x1b[31mname", {}, 0, {});
  ctrl.write(path("ctrl.gguf"));
  EXPECT_NE(error_of(path("ctrl.gguf")).find("tensor 'bad\\x0a\\x1b[31mname' has 0 dimensions"), std::string::npos)
      << error_of(path("ctrl.gguf"));
  // A corrupt name length once made an error line of megabytes: the name is cut, the line stays short.
  GgufWriter long_name;
  long_name.tensor(std::string(1 << 20, 'n'), {}, 0, {});
  long_name.write(path("long.gguf"));
  const std::string cut = error_of(path("long.gguf"));
  EXPECT_LT(cut.size(), 400u) << cut.substr(0, 400);
  EXPECT_NE(cut.find("nnn... (" + std::to_string((1 << 20) - 120) + " more bytes)' has 0 dimensions"), std::string::npos)
      << cut.substr(0, 400);
  // A quantised tensor is bounds-checked by its blocks (Q4_K: 144 bytes per 256 values), used or not.
  GgufWriter q4k = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer);
  q4k.tensor("unused.weight", {256, 4}, 12, std::vector<char>(4 * 144 - 1));
  std::vector<char> short_q4k = q4k.bytes();
  EXPECT_NE(save(short_q4k).find("tensor 'unused.weight' (Q4_K, 576 bytes"), std::string::npos) << save(short_q4k);
  // A big-endian file says so.
  std::vector<char> big_endian = good;
  const std::uint32_t version = __builtin_bswap32(3u);
  std::memcpy(big_endian.data() + 4, &version, 4);
  EXPECT_NE(save(big_endian).find("(this one is big-endian)"), std::string::npos);
  // A vocabulary of another size is refused before its strings are decoded.
  EXPECT_THROW(read_gguf_vocabulary(write("v.gguf"), shape_.vocab_size + 1), FormatError);
}

TEST_F(GeneratedGguf, ModelsShardlineCannotRunAreRefusedByName) {
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("blk.0.attn_q.weight", {4}, 0, std::vector<char>(16)); })
                .find("holds two tensors named 'blk.0.attn_q.weight'"),
            std::string::npos);
  const std::string twice = error_with([](GgufWriter& w) { w.u32("llama.block_count", 3); });
  EXPECT_NE(twice.find("is corrupt at byte "), std::string::npos) << twice;
  EXPECT_NE(twice.find(", 'llama.block_count', is already in the file (a count or length before it is probably wrong"),
            std::string::npos)
      << twice;
  // A tensor of a quantised type shardline does not decode is named with its type.
  GgufWriter iq2_model;
  iq2_model.string("general.architecture", "llama");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::uint32_t>>{
           {"llama.embedding_length", 256}, {"llama.feed_forward_length", 512}, {"llama.block_count", 1},
           {"llama.attention.head_count", 2}, {"llama.context_length", 8}}) {
    iq2_model.u32(key, value);
  }
  const GgufWriter no_tensors = iq2_model;
  iq2_model.tensor("token_embd.weight", {256, 300}, 16, std::vector<char>(300 * 66));  // IQ2_XXS: 256 values in 66 bytes
  iq2_model.write(path("iq2.gguf"));
  EXPECT_NE(error_of(path("iq2.gguf")).find("tensor 'token_embd.weight' is IQ2_XXS; shardline reads F32, F16, BF16, "
                                            "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and "
                                            "IQ4_XS tensors (requantize"),
            std::string::npos)
      << error_of(path("iq2.gguf"));
  // A ternary type is named; an id no llama.cpp type has is a corrupt file, not a type to requantize from.
  for (const auto& [type, said] : std::vector<std::pair<std::uint32_t, std::string>>{
           {34, "tensor 'token_embd.weight' is TQ1_0; shardline reads"},
           {4000, "tensor 'token_embd.weight' has element type id 4000, which no llama.cpp type shardline knows has "
                  "(the last is MXFP4, 39): the file is corrupt"}}) {
    GgufWriter odd = no_tensors;
    odd.tensor("token_embd.weight", {256, 300}, type, std::vector<char>(300 * 66));
    odd.write(path("odd.gguf"));
    EXPECT_NE(error_of(path("odd.gguf")).find(said), std::string::npos) << error_of(path("odd.gguf"));
  }
  GgufWriter gpt2;
  gpt2.string("general.architecture", "gpt2");
  gpt2.write(path("gpt2.gguf"));
  EXPECT_NE(error_of(path("gpt2.gguf")).find("architecture 'gpt2'"), std::string::npos);
  GgufWriter no_arch;
  no_arch.u32("llama.block_count", 1);
  no_arch.write(path("no_arch.gguf"));
  EXPECT_NE(error_of(path("no_arch.gguf")).find("has no general.architecture key"), std::string::npos)
      << error_of(path("no_arch.gguf"));
}

TEST_F(GeneratedGguf, MissingOrMisshapenTensorsAndPartialRopeAreRefused) {
  // Built from the generated model, then one thing changed.
  const std::string good = write("good.gguf");
  std::vector<char> bytes = file_bytes(good, 0, fs::file_size(good));
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text(bytes.begin(), bytes.end());
    const std::size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    std::vector<char> b = bytes;
    std::copy(to.begin(), to.end(), b.begin() + at);
    std::ofstream(path("edit.gguf"), std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return error_of(path("edit.gguf"));
  };
  EXPECT_NE(replaced("blk.1.ffn_up.weight", "blk.1.ffn_UP.weight").find("has no tensor 'blk.1.ffn_up.weight'"),
            std::string::npos);
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.rope_dimension_count = 10}).write(path("rope.gguf"));
  EXPECT_NE(error_of(path("rope.gguf")).find("RoPE rotates 10 of each head's 20 dimensions"), std::string::npos)
      << error_of(path("rope.gguf"));
  // A head count at odds with the tensors is named by the tensor it misshapes (it read as partial RoPE).
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.head_count = 12}).write(path("heads.gguf"));
  EXPECT_NE(error_of(path("heads.gguf")).find("has ne ["), std::string::npos) << error_of(path("heads.gguf"));
  llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.feed_forward_length = 256}).write(path("shape.gguf"));
  EXPECT_NE(error_of(path("shape.gguf")).find("tensor 'blk.0.ffn_gate.weight' has ne [120, 250] but the metadata's "
                                               "shape implies [120, 256]"),
            std::string::npos)
      << error_of(path("shape.gguf"));
  // What llama.cpp would use and shardline cannot: extra tensors (biases, RoPE factors), RoPE scaling by
  // factor alone, heads of another size than dim / head_count.
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("blk.1.attn_q.bias", {120}, 0, std::vector<char>(480)); })
                .find("holds the tensor 'blk.1.attn_q.bias', which shardline's llama model does not use"),
            std::string::npos);
  // A layer past llama.block_count (3) names the disagreement, not biases.
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("blk.3.attn_norm.weight", {120}, 0, std::vector<char>(480)); })
                .find("holds the tensor 'blk.3.attn_norm.weight' but llama.block_count is 3: the metadata and the "
                      "tensors disagree on the number of layers"),
            std::string::npos);
  // RoPE divisors (Llama 3.1) are read; zeros, or a tensor of the wrong length or type, are not.
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("rope_freqs.weight", {10}, 0, std::vector<char>(40)); })
                .find("rope_freqs.weight[0] is 0; RoPE frequency factors must be numbers from 0.001 to 1e9"),
            std::string::npos);
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("rope_freqs.weight", {9}, 0, std::vector<char>(36)); })
                .find("tensor 'rope_freqs.weight' is F32 [9]; RoPE frequency factors are F32 [10]"),
            std::string::npos);
  // A divisor near 0 turned the angle infinite and every logit NaN.
  EXPECT_NE(error_with([](GgufWriter& w) {
              std::vector<float> tiny(10, 1.0f);
              tiny[3] = 1e-30f;
              std::vector<char> bytes(40);
              std::memcpy(bytes.data(), tiny.data(), 40);
              w.tensor("rope_freqs.weight", {10}, 0, bytes);
            }).find("rope_freqs.weight[3] is 1e-30; RoPE frequency factors must be numbers from 0.001 to 1e9"),
            std::string::npos);
  EXPECT_NE(error_with([](GgufWriter& w) { w.tensor("blk.3.attn_q.weight", {120, 120}, 0, std::vector<char>(57600)); })
                .find("'blk.3.attn_q.weight'"),
            std::string::npos);  // a fourth layer's tensor in a 3-layer model
  EXPECT_NE(error_with([](GgufWriter& w) { w.f32("llama.rope.scaling.factor", 4.0f); })
                .find("llama.rope.scaling.factor 4 asks for RoPE scaling"),
            std::string::npos);
  EXPECT_NE(error_with([](GgufWriter& w) { w.u32("llama.attention.key_length", 10); })
                .find("llama.attention.key_length is 10 but dim / head_count is 20"),
            std::string::npos);
  EXPECT_EQ(error_with([](GgufWriter& w) { w.f32("llama.rope.scaling.factor", 1.0f); }), "no FormatError");
  GgufWriter no_vocab = llama_gguf_from_llama2c(paths_.model, paths_.tokenizer, {.with_vocabulary = false});
  no_vocab.write(path("novocab.gguf"));
  EXPECT_EQ(read_model_file(path("novocab.gguf")).shape.vocab_size, shape_.vocab_size);
  try {
    Tokenizer(path("novocab.gguf"), shape_.vocab_size);
    FAIL() << "no vocabulary, no tokenizer";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("pass --tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardline::runtime
