// A digest of a file's size and of evenly spaced samples of its bytes, for checking that the ranks of a job
// were given the same model file without reading all of it: each host of a job may hold its own copy at the
// same path (gen-model writes one per host), and a stale or different copy of the same shape loaded, ran and
// gave other tokens without a word. 128 samples of 4 KiB (512 KiB read, the file's first and last bytes
// among them) tell apart files that differ in a tensor's worth of bytes; two copies differing only in a
// few bytes between the samples read alike.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline {

inline constexpr int kDigestSamples = 128;
inline constexpr std::size_t kDigestSampleBytes = 4096;

// 16 hex digits; ResourceError naming the path where it cannot be read.
inline std::string sampled_file_digest(const std::string& path) {
  struct Fd {  // closed on every way out, an allocation that throws included
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } const file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  const int fd = file.fd;
  if (fd < 0) throw ResourceError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw ResourceError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t sample = std::min<std::uint64_t>(kDigestSampleBytes, size);
  std::string bytes = fmt::format("{}|", size);
  std::string block(sample, '\0');
  for (int i = 0; i < kDigestSamples && sample > 0; ++i) {
    const std::uint64_t offset = (size - sample) * static_cast<std::uint64_t>(i) / (kDigestSamples - 1);
    std::size_t got = 0;
    while (got < sample) {
      const ssize_t n = ::pread(fd, block.data() + got, sample - got, static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw ResourceError(fmt::format("cannot read '{}' at byte {}: {}", path, offset + got,
                                        std::strerror(n < 0 ? errno : EIO)));
      }
      got += static_cast<std::size_t>(n);
    }
    bytes += block;
  }
  return fmt::format("{:016x}", std::hash<std::string_view>{}(bytes));
}

}  // namespace shardline
