// What ranks compare at start-up (launch/agreed_fields.h) and the sampled digest of a model file
// (common/file_digest.h): a rank that differs must be told which field, with both values.
#include "launch/agreed_fields.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/file_digest.h"

namespace shardline::launch {
namespace {

constexpr const char* kFix = "give every rank the same model file, prompts and layout flags";

AgreedFields some_fields() {
  return {{"--help", "not given"}, {"model shape", "dim 64, hidden 160"}, {"--kv-dtype", "auto"},
          {"prompt", "Once upon a time"}};
}

TEST(AgreedFields, EncodeDecodeRoundTripsAnyBytes) {
  AgreedFields fields = some_fields();
  fields.push_back({"odd", std::string("a:1:\0b\n12:", 10)});  // separators, digits, a NUL
  fields.push_back({"", ""});
  const AgreedFields back = decode_fields(encode_fields(fields));
  ASSERT_EQ(back.size(), fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    EXPECT_EQ(back[i].name, fields[i].name);
    EXPECT_EQ(back[i].value, fields[i].value);
  }
  EXPECT_TRUE(decode_fields("").empty());
}

TEST(AgreedFields, MalformedBytesAreAConfigErrorNotACrash) {
  const std::string good = encode_fields(some_fields());
  for (const std::string& bad : {std::string("5:ab"), std::string("x:1"), std::string("3"), std::string(":"),
                                std::string("99999999999999:a"), good.substr(0, good.size() - 1), good + "4:name"}) {
    EXPECT_THROW(decode_fields(bad), ConfigError) << bad;
  }
}

TEST(AgreedFields, TheFirstDifferingFieldIsNamedWithBothValues) {
  const AgreedFields rank0 = some_fields();
  EXPECT_FALSE(first_difference(rank0, rank0));
  AgreedFields mine = rank0;
  mine[2].value = "int8";
  mine[3].value = "other";  // later: not the one named
  const auto d = first_difference(mine, rank0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "--kv-dtype");
  EXPECT_EQ(d->mine, "int8");
  EXPECT_EQ(d->rank0, "auto");
  EXPECT_EQ(describe_difference(*d, 3, false, kFix),
            "this rank's --kv-dtype differs from rank 0's ('int8' here, 'auto' on rank 0); give every rank the same "
            "model file, prompts and layout flags");
  EXPECT_EQ(describe_difference(*d, 1, true, kFix),
            "rank 0's --kv-dtype differs from every other rank's ('auto' on rank 0, 'int8' on rank 1 and the rest); "
            "give every rank the same model file, prompts and layout flags");
}

TEST(AgreedFields, ValuesInTheLineAreEscapedAndRank0WithoutFieldsIsNoDifference) {
  const FieldDifference d{"prompt", "two\nlines \x1b[2J", "ok"};
  const std::string line = describe_difference(d, 1, false, kFix);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  EXPECT_NE(line.find("'two\\x0alines \\x1b[2J' here"), std::string::npos) << line;
  // Rank 0 that failed to list its fields sends none: its own error is the one to report, not a difference.
  EXPECT_FALSE(first_difference(some_fields(), {}));
}

TEST(AgreedFields, ARankGivenHelpOrAnotherBuildDiffersAtItsFirstField) {
  const AgreedFields rank0 = some_fields();
  const AgreedFields help = {{"--help", "given"}};  // a rank given --help parsed nothing else
  auto d = first_difference(help, rank0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "--help");
  EXPECT_EQ(d->mine, "given");
  // One field fewer or other names (another shardline on one host): still a difference, never a match.
  AgreedFields shorter(rank0.begin(), rank0.end() - 1);
  d = first_difference(shorter, rank0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "prompt");
  EXPECT_EQ(d->mine, "(none)");
  AgreedFields renamed = rank0;
  renamed[1].name = "model dims";
  d = first_difference(renamed, rank0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "model dims");
  EXPECT_NE(d->rank0.find("'model shape'"), std::string::npos) << d->rank0;
}

TEST(AgreedFields, LongTextIsComparedWholeAndShownByItsStart) {
  const std::string a(500, 'a');
  std::string b = a;
  b[400] = 'b';  // past what is shown
  EXPECT_EQ(comparable_value("short prompt"), "short prompt");
  EXPECT_NE(comparable_value(a), comparable_value(b));
  EXPECT_LT(comparable_value(a).size(), 120u);
  EXPECT_EQ(comparable_value(a).substr(0, 60), a.substr(0, 60));
  EXPECT_NE(comparable_value(a).find("500 bytes"), std::string::npos) << comparable_value(a);
  // Shown up to a character's start, never inside one.
  const std::string wide = std::string(59, 'a') + "中" + std::string(100, 'b');
  EXPECT_EQ(comparable_value(wide).substr(0, 62), std::string(59, 'a') + "...");
}

class FileDigest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static void write(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() / ("file_digest_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
};

TEST_F(FileDigest, SameBytesSameDigestAndAChangedSampleOrSizeDiffers) {
  std::string bytes(3 << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 2654435761u >> 13);
  write(path("a"), bytes);
  write(path("copy"), bytes);
  const std::string digest = sampled_file_digest(path("a"));
  EXPECT_EQ(digest.size(), 16u);
  EXPECT_EQ(sampled_file_digest(path("copy")), digest);
  // The first and last bytes are sampled, and 4 KiB at each 127th of the way between.
  const std::size_t span = bytes.size() - kDigestSampleBytes;  // sample i starts at span * i / 127
  for (const std::size_t at : {std::size_t{0}, bytes.size() - 1, span * 64 / 127 + 100, span * 5 / 127 + 4095}) {
    std::string changed = bytes;
    changed[at] ^= 1;
    write(path("changed"), changed);
    EXPECT_NE(sampled_file_digest(path("changed")), digest) << "byte " << at;
  }
  write(path("longer"), bytes + std::string(1, '\0'));
  EXPECT_NE(sampled_file_digest(path("longer")), digest);
  // Files shorter than a sample, and empty ones, have digests too.
  write(path("tiny"), "abc");
  write(path("tiny2"), "abd");
  write(path("empty"), "");
  EXPECT_NE(sampled_file_digest(path("tiny")), sampled_file_digest(path("tiny2")));
  EXPECT_NE(sampled_file_digest(path("empty")), sampled_file_digest(path("tiny")));
}

TEST_F(FileDigest, AMissingFileIsAResourceErrorNamingIt) {
  try {
    sampled_file_digest(path("nope.bin"));
    FAIL() << "no error";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.bin"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardline::launch
