#include "memory/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/units.h"
#include "memory/binding.h"

namespace shardline::memory {

namespace {
#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;  // Linux 5.14's value, for older headers
#endif
}  // namespace

void MappedRegion::populate_in_slices(std::size_t slice_bytes, const std::function<void()>& after_each) const {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data_);
  const std::uintptr_t end = begin + bytes_;
  for (std::uintptr_t at = begin / page * page; at < end; at += slice_bytes) {
    const std::size_t bytes = std::min<std::uintptr_t>(slice_bytes, end - at);
    // MADV_POPULATE_READ (Linux 5.14) faults them in as MAP_POPULATE does; before it, a read of each page.
    if (::madvise(reinterpret_cast<void*>(at), bytes, kMadvPopulateRead) != 0) {
      volatile std::byte sink{};
      for (std::uintptr_t p = std::max(at, begin); p < at + bytes; p = (p / page + 1) * page) {
        sink = *reinterpret_cast<const std::byte*>(p);
      }
      (void)sink;
    }
    after_each();
  }
}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (base_) munmap(base_, map_bytes_);
    base_ = std::exchange(other.base_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MappedRegion::~MappedRegion() {
  if (base_) munmap(base_, map_bytes_);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a named pipe given as a model fails the regular-file test below instead of waiting for a
  // writer in open(); it changes nothing for a regular file.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    throw ResourceError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw ResourceError(fmt::format("'{}' is not a regular file", path));
  }
  size_bytes_ = static_cast<std::uint64_t>(st.st_size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (fd_ >= 0) ::close(fd_);
}

MappedRegion MappedFile::map(std::uint64_t offset, std::uint64_t bytes, const MapOptions& options) const {
  if (offset > size_bytes_ || bytes > size_bytes_ - offset) {
    throw FormatError(fmt::format("'{}' is truncated: needs bytes [{}, {}) but has {}", path_, offset,
                                  offset + bytes, size_bytes_));
  }
  if (bytes == 0) return {};
  static const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t aligned = offset / page * page;
  const std::size_t map_bytes = static_cast<std::size_t>(offset - aligned + bytes);
  const int flags = MAP_PRIVATE | (options.populate ? MAP_POPULATE : 0);
  void* base = mmap(nullptr, map_bytes, PROT_READ, flags, fd_, static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int error = errno;
    // ENOMEM here is address space (ulimit -v) or the map count, not the file: say which limit to look at.
    throw ResourceError(fmt::format("mmap of {} of '{}' failed: {}{}", format_bytes(static_cast<double>(map_bytes)),
                                    path_, std::strerror(error),
                                    error == ENOMEM ? " (the process's address space is exhausted: raise or lift "
                                                      "'ulimit -v', or run fewer ranks on this host)"
                                                    : ""));
  }
  if (options.numa_node >= 0) {
    try {
      bind_range_to_node(base, map_bytes, options.numa_node, /*move_existing=*/options.populate);
    } catch (...) {
      munmap(base, map_bytes);
      throw;
    }
  }
  return MappedRegion(base, map_bytes, static_cast<const std::byte*>(base) + (offset - aligned),
                      static_cast<std::size_t>(bytes));
}

void MappedFile::read(std::uint64_t offset, void* dst, std::size_t bytes) const {
  if (offset > size_bytes_ || bytes > size_bytes_ - offset) {
    throw FormatError(fmt::format("'{}' is truncated: needs {} bytes at offset {} but has {} bytes in all",
                                  path_, bytes, offset, size_bytes_));
  }
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, static_cast<char*>(dst) + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw ResourceError(fmt::format("reading '{}' failed: {}", path_, std::strerror(errno)));
    if (got == 0) {  // the end of the file before the size it had when opened: cut short since (errno says nothing)
      struct stat now {};
      const std::string size_now = ::fstat(fd_, &now) == 0 ? fmt::format("{} bytes", now.st_size) : "fewer";
      throw FormatError(fmt::format("'{}' is truncated: it had {} bytes when opened and has {} now; was it "
                                    "overwritten while it was being read?",
                                    path_, size_bytes_, size_now));
    }
    done += static_cast<std::size_t>(got);
  }
}

}  // namespace shardline::memory
