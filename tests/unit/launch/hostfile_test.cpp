// Hostfile and rankfile parsing: what mpirun accepts parses the same way; what it rejects or misreads
// is a ConfigError naming file:line.
#include "launch/hostfile.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/printable.h"

namespace shardline::launch {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_hostfile(text, "h");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string rankfile_error_of(const std::string& text) {
  try {
    parse_rankfile(text, "r");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Hostfile, SlotsCommentsAndAliases) {
  const Hostfile f = parse_hostfile(
      "# cluster\n\nnode01 slots=2\nnode02 slots=4 max_slots=8   # comment\nuser@node03 count=1\n10.0.0.4 cpu=2 max-slots=2 port=22 username=me\n",
      "h");
  ASSERT_EQ(f.hosts.size(), 4u);
  EXPECT_EQ(f.hosts[0].host, "node01");
  EXPECT_EQ(f.hosts[0].slots, 2);
  EXPECT_EQ(f.hosts[0].line, 3);
  EXPECT_EQ(f.hosts[1].max_slots, 8);
  EXPECT_EQ(f.hosts[2].host, "node03");  // user@ dropped
  EXPECT_EQ(f.hosts[2].slots, 1);
  EXPECT_EQ(f.hosts[3].slots, 2);
  EXPECT_EQ(f.total_slots(), 9);
  EXPECT_NE(f.find("node02"), nullptr);
  EXPECT_EQ(f.find("node09"), nullptr);
}

// Blanks around '=' are Open MPI's too: mpirun runs 3 ranks on 'localhost slots = 3' (and refuses 3 on
// 'slots = 1'), so launch-check must read the same count rather than refuse the line.
TEST(Hostfile, BlanksAroundTheEqualsSignAreReadAsMpirunReadsThem) {
  const Hostfile f = parse_hostfile("a slots = 3\nb slots= 2 max_slots =4\nc slots =1\n", "h");
  ASSERT_EQ(f.hosts.size(), 3u);
  EXPECT_EQ(f.hosts[0].slots, 3);
  EXPECT_EQ(f.hosts[1].slots, 2);
  EXPECT_EQ(f.hosts[1].max_slots, 4);
  EXPECT_EQ(f.hosts[2].slots, 1);
  EXPECT_EQ(f.total_slots(), 6);
}

TEST(Hostfile, HostWithoutSlotsLeavesTheTotalUnknown) {
  const Hostfile f = parse_hostfile("node01 slots=2\nnode02\n", "h");
  EXPECT_FALSE(f.hosts[1].slots);
  EXPECT_FALSE(f.total_slots());
}

TEST(Hostfile, RepeatedBareHostCountsOneSlotPerLine) {
  // mpirun: "localhost" three times = 3 slots.
  const Hostfile f = parse_hostfile("a\na\na\nb slots=1\n", "h");
  ASSERT_EQ(f.hosts.size(), 2u);
  EXPECT_EQ(f.hosts[0].slots, 3);
  EXPECT_EQ(f.total_slots(), 4);
}

TEST(Hostfile, MistakesNameFileLineAndTheFix) {
  EXPECT_EQ(error_of("a slots=1\nb slot=2\n"),
            "h:2: unknown keyword 'slot'; hostfile lines are 'HOST [slots=N] [max_slots=N]'");
  EXPECT_EQ(error_of("a slots=two\n"),
            "h:1: slots='two' must be a whole number of ranks from 1 to 999999 (hostfile lines are 'HOST [slots=N] "
            "[max_slots=N]')");
  EXPECT_NE(error_of("a slots=0\n").find("h:1: slots='0' must be a whole number of ranks from 1"), std::string::npos);
  // The limit is said: "positive" was no help for a count too large.
  EXPECT_NE(error_of("a slots=2147483647\n").find("slots='2147483647' must be a whole number of ranks from 1 to 999999"),
            std::string::npos);
  EXPECT_NE(error_of("a slots=-1\n").find("h:1: slots='-1'"), std::string::npos);
  EXPECT_NE(error_of("a slots=\n").find("h:1: slots=''"), std::string::npos);
  EXPECT_NE(error_of("a slots=2 max_slots=1\n").find("h:1: max_slots=1 is below slots=2"), std::string::npos);
  EXPECT_NE(error_of("a b\n").find("h:1: unexpected 'b' after host 'a'"), std::string::npos);
  EXPECT_NE(error_of("a,b slots=1\n").find("h:1: 'a,b' names several hosts"), std::string::npos);
  EXPECT_NE(error_of("slots=2\n").find("h:1: 'slots=2' is not a host name"), std::string::npos);
  EXPECT_NE(error_of("node/1\n").find("h:1: 'node/1' is not a host name"), std::string::npos);
  // mpirun's --host form, which its hostfile parser refuses; an IPv6 address (several colons) is no such line.
  EXPECT_EQ(error_of("node1:4\n"), "h:1: 'node1:4' is mpirun's --host form; a hostfile line says 'node1 slots=4'");
  EXPECT_EQ(error_of("node1:4 slots=2\n"), "h:1: 'node1:4' is mpirun's --host form; a hostfile line says 'node1 slots=N'");
  EXPECT_EQ(error_of("node1:0\n"), "h:1: 'node1:0' is mpirun's --host form; a hostfile line says 'node1 slots=N'");
  // What Open MPI 4.1's mpirun refuses: '_' and ':' in node names (so IPv6 addresses), carriage returns.
  EXPECT_NE(error_of("fe80::1 slots=2\n").find("h:1: 'fe80::1' is not a host name or IPv4 address mpirun takes"), std::string::npos);
  EXPECT_NE(error_of("node_a slots=2\n").find("h:1: 'node_a' is not a host name"), std::string::npos);
  EXPECT_EQ(error_of("a slots=2\nb slots=2\r\n"),
            "h:2: the line holds a carriage return (Windows line endings), which mpirun refuses; convert the file: "
            "sed -i 's/\\r$//' h");
  EXPECT_NE(error_of("a slots=2 port=\n").find("h:1: port='' needs a port number"), std::string::npos);
  EXPECT_NE(error_of("a slots=2 port=ssh\n").find("h:1: port='ssh' needs a port number"), std::string::npos);
  EXPECT_EQ(parse_hostfile("# made on Windows\r\na slots=2 # comment\r\n", "h").hosts.at(0).slots, 2);  // as mpirun
  EXPECT_NE(error_of("a slots=1 slots=2\n").find("h:1: slots given twice"), std::string::npos);
  EXPECT_NE(error_of("a slots=1\nb\na slots=1\n").find("h:3: 'a' is already listed on line 1"), std::string::npos);
  EXPECT_NE(error_of("a\na slots=2\n").find("h:2: 'a' is already listed on line 1"), std::string::npos);
  EXPECT_NE(error_of("# only comments\n\n").find("h: names no host"), std::string::npos);
  EXPECT_NE(error_of("").find("names no host"), std::string::npos);
}

TEST(Hostfile, UnreadableFileIsAResourceError) {
  EXPECT_THROW(read_hostfile("/nonexistent/hostfile"), ResourceError);
}

// A named pipe nobody writes to held launch-check (and plan's --cluster) forever; a pipe that does give its
// text is read as a file (`--hostfile <(scontrol show hostnames)`).
TEST(Hostfile, APipeMustGiveItsTextWithinItsTimeout) {
  const std::string fifo = ::testing::TempDir() + "hostfile_fifo_" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_hostfile(fifo, 0.2);
    ADD_FAILURE() << "a pipe nobody writes was read";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("hostfile '" + fifo + "' gave nothing for 0.2 s: a pipe nobody writes to?"),
              std::string::npos) << e.what();
  }
  std::thread writer([&] { std::ofstream(fifo) << "node01 slots=2\n"; });
  const Hostfile f = read_hostfile(fifo, 30.0);
  writer.join();
  EXPECT_EQ(f.total_slots(), 2);
  ::unlink(fifo.c_str());
}

// Counts add up in 64 bits: 2200 hosts of 999999 slots each overflowed an int (a fuzzing pass).
TEST(Hostfile, ManyLargeHostsAddUpWithoutOverflow) {
  std::string text;
  for (int i = 0; i < 2200; ++i) text += fmt::format("h{} slots=999999\n", i);  // (GCC 12 warns of "h" + ...)
  EXPECT_EQ(parse_hostfile(text, "h").total_slots(), std::int64_t{2200} * 999999);
}

TEST(Rankfile, Ranks) {
  const auto r = parse_rankfile("# tp=2\nrank 0=node01 slot=0:0-7\nrank 1 = node01 slot = 1:0-7\nrank 2=+n1 slot=0,1\n", "r");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].rank, 0);
  EXPECT_EQ(r[0].host, "node01");
  EXPECT_EQ(r[0].slot, "0:0-7");
  EXPECT_EQ(r[0].line, 2);
  EXPECT_EQ(r[1].slot, "1:0-7");
  EXPECT_EQ(r[2].host, "+n1");
}

TEST(Rankfile, MistakesNameFileAndLine) {
  EXPECT_NE(rankfile_error_of("rank 0=a slot=0\nrank 0=b slot=1\n").find("r:2: rank 0 is already placed on line 1"),
            std::string::npos);
  EXPECT_NE(rankfile_error_of("rank x=a slot=0\n").find("r:1: 'x' is not a rank number"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a\n").find("r:1: 'rank 0=a' is not a rank line"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rnak 0=a slot=1\n").find("r:1:"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=core1\n").find("r:1: slot 'core1'"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a/b slot=1\n").find("r:1: 'a/b' is not a host"), std::string::npos);
  // A +nI index too long to be one (std::stoul threw out of range: "unexpected: stoul", exit 1).
  EXPECT_NE(rankfile_error_of("rank 0=+n12345678901234567890123 slot=1\n").find("r:1: '+n12345678901234567890123' is "
                                                                               "not a host name, IPv4 address or +nI"),
            std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=node_a slot=1\n").find("r:1: 'node_a' is not a host name"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=0\r\n").find("r:1: the line holds a carriage return"), std::string::npos);
  EXPECT_NE(rankfile_error_of("\n").find("places no rank"), std::string::npos);
}

// Slots with mpirun's characters in a shape it rejects only at launch are refused here, each saying why;
// its own forms pass.
TEST(Rankfile, SlotsAreCheckedItemByItem) {
  EXPECT_NE(rankfile_error_of("rank 0=a slot=0:9-2\n").find("range '9-2' runs backwards"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=5-\n").find("'5-' is not a core or a range"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=0:0,,1\n").find("an empty item"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=0:1:2\n").find("'1:2' is not a core"), std::string::npos);
  EXPECT_NE(rankfile_error_of("rank 0=a slot=-1\n").find("'-1' is not a core"), std::string::npos);
  for (const char* slot : {"0", "0-7", "1:0-7", "0,2,4-5", "*", "1:*", "*:0-3", "1:0,1", "0:2-3,1:0-1"}) {
    EXPECT_NO_THROW(parse_rankfile(std::string("rank 0=a slot=") + slot + "\n", "r")) << slot;
  }
}

// User text in an error line is escaped and cut (from a fuzzing pass): a NUL once ended the message there, an
// escape sequence reached the terminal, and a rankfile line of 30 KB overflowed the stack in the regex.
TEST(Hostfile, ErrorsQuoteTheFileSafely) {
  EXPECT_NE(error_of(std::string("a slots=2\0junk\n", 15)).find("slots='2\\x00junk' must be"), std::string::npos)
      << error_of(std::string("a slots=2\0junk\n", 15));
  EXPECT_NE(error_of("a\x1b[31m slots=1\n").find("'a\\x1b[31m' is not a host name"), std::string::npos);
  EXPECT_NE(error_of(std::string(300, 'h') + " slots=1\n").find("is not a host name"), std::string::npos);
  const std::string long_line = "rank 0=" + std::string(30000, 'n') + " slot=0:0\n";
  EXPECT_EQ(rankfile_error_of(long_line), "r:1: a line of 30016 bytes; lines are at most 4096");
  EXPECT_EQ(error_of("a slots=1\n" + std::string(5000, ' ') + "\n"), "h:2: a line of 5000 bytes; lines are at most 4096");
}

TEST(Printable, EscapesControlBytesAndBadUtf8KeepsCharactersAndCutsWholeOnes) {
  EXPECT_EQ(printable("plain text"), "plain text");
  EXPECT_EQ(printable(std::string("a\0b\n\x1b\x7f\\", 7)), "a\\x00b\\x0a\\x1b\\x7f\\x5c");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xc3(\xff\xc0\xaf\xed\xa0\x80"), "\\xc3(\\xff\\xc0\\xaf\\xed\\xa0\\x80");  // cut, stray, overlong, surrogate
  EXPECT_EQ(printable("ab\xc3", 10), "ab\\xc3");  // a character cut off by the end of the text
  EXPECT_EQ(printable("a\xc2\x9b" "31m \xe2\x80\xae" "b \xc2\xa0"), "a\\xc2\\x9b" "31m \\xe2\\x80\\xae" "b \xc2\xa0");  // CSI, RLO; NBSP stays
  EXPECT_EQ(printable("abcdef", 4), "abcd... (2 more bytes)");
  EXPECT_EQ(printable("ab\xc3\xa9" "cd", 3), "ab... (4 more bytes)");  // never half a character
}

}  // namespace
}  // namespace shardline::launch
