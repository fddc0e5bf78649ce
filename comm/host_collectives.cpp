#include "comm/host_collectives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "comm/mpi_check.h"
#include "comm/liveness.h"
#include "comm/peer_name.h"
#include "comm/poller.h"
#include "common/error.h"

namespace shardline::comm {

namespace {

// A rank's region: its flag alone on the first page, then its two slots.
constexpr std::size_t kFlagBytes = 4096;
constexpr std::size_t kRegionBytes = kFlagBytes + 2 * HostCollectives::kSlotBytes;

constexpr std::size_t kSlotFloats = HostCollectives::kSlotBytes / sizeof(float);  // per round

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "the flags are shared between processes");

// Whether every rank of comm shares this host's memory, the same answer on all of them.
bool all_on_one_host(MPI_Comm comm, int rank, int size) {
  MPI_Comm shared;
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared),
            "Comm_split_type while setting up host collectives");
  int shared_size = 0;
  MPI_Comm_size(shared, &shared_size);
  MPI_Comm_free(&shared);
  int here = shared_size == size ? 1 : 0, everywhere = 0;
  check_mpi(MPI_Allreduce(&here, &everywhere, 1, MPI_INT, MPI_MIN, comm),
            "Allreduce while setting up host collectives");
  return everywhere == 1;
}

// Maps the segment `name` (bytes long; rank 0 creates it) and allocates this rank's region of it, or
// returns null (having unlinked a segment it created). Each rank allocates its own region so that the
// pages come from its NUMA node (tmpfs allocates by the caller's memory policy), where its writes go; and
// with posix_fallocate, so that a /dev/shm too small for the segment fails here, not with SIGBUS at the
// first touch of a page past what it could hold.
void* map_segment(const char* name, std::size_t bytes, bool create, std::size_t region_offset) {
  const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
  if (fd < 0) return nullptr;
  void* at = MAP_FAILED;
  if ((!create || ftruncate(fd, static_cast<off_t>(bytes)) == 0) &&
      posix_fallocate(fd, static_cast<off_t>(region_offset), static_cast<off_t>(kRegionBytes)) == 0) {
    at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (at != MAP_FAILED) return at;
  if (create) shm_unlink(name);
  return nullptr;
}

}  // namespace

std::unique_ptr<HostCollectives> HostCollectives::create(MPI_Comm comm, double timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size == 1 || !all_on_one_host(comm, rank, size)) return nullptr;
  const std::size_t bytes = kRegionBytes * static_cast<std::size_t>(size);
  char name[64] = {};
  void* segment = nullptr;
  if (rank == 0) {
    static int created = 0;  // several groups of one process each get their own segment
    std::snprintf(name, sizeof name, "/shardline-%d-%d", static_cast<int>(getpid()), created++);
    segment = map_segment(name, bytes, true, 0);
    if (segment == nullptr) name[0] = '\0';  // tells the others not to try (and nothing is left to unlink)
  }
  // A setup collective that fails ends the job; the segment must not outlive it in /dev/shm.
  auto check_or_release = [&](int code, const char* what) {
    if (code == MPI_SUCCESS) return;
    if (segment != nullptr) munmap(segment, bytes);
    if (rank == 0 && name[0] != '\0') shm_unlink(name);
    check_mpi(code, what);
  };
  check_or_release(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm), "Bcast while setting up host collectives");
  if (rank != 0 && name[0] != '\0') segment = map_segment(name, bytes, false, kRegionBytes * rank);
  int mapped = segment != nullptr ? 1 : 0, all_mapped = 0;
  check_or_release(MPI_Allreduce(&mapped, &all_mapped, 1, MPI_INT, MPI_MIN, comm),
                   "Allreduce while setting up host collectives");
  if (rank == 0 && name[0] != '\0') shm_unlink(name);  // every rank that could map it has
  if (all_mapped == 0) {
    if (segment != nullptr) munmap(segment, bytes);
    return nullptr;
  }
  // The pages start zeroed: every flag at call 0.
  return std::unique_ptr<HostCollectives>(new HostCollectives(comm, segment, bytes, timeout_s));
}

HostCollectives::HostCollectives(MPI_Comm comm, void* segment, std::size_t bytes, double timeout_s)
    : comm_(comm), segment_(segment), bytes_(bytes), timeout_s_(timeout_s) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

HostCollectives::~HostCollectives() { munmap(segment_, bytes_); }

float* HostCollectives::slot(int rank, std::uint64_t call) const {
  char* region = static_cast<char*>(segment_) + kRegionBytes * static_cast<std::size_t>(rank);
  return reinterpret_cast<float*>(region + kFlagBytes + (call & 1) * kSlotBytes);
}

namespace {

std::atomic_ref<std::uint64_t> flag_of(void* segment, int rank) {
  return std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(static_cast<char*>(segment) + kRegionBytes * static_cast<std::size_t>(rank)));
}

}  // namespace

void HostCollectives::publish(std::uint64_t call) { flag_of(segment_, rank_).store(call, std::memory_order_release); }

void HostCollectives::wait_for(int r, std::uint64_t call, Poller& poller, const char* what) {
  while (flag_of(segment_, r).load(std::memory_order_acquire) < call) {
    if (poller.spun_out()) {
      int pending = 0;  // any MPI call drives Open MPI's progress engine (sends in flight)
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &pending, MPI_STATUS_IGNORE);
      answer_pings();
    }
    if (!poller.pause()) {
      throw CommError(fmt::format("{} timed out after {:g} s (--comm-timeout) waiting for {}{}", what, timeout_s_,
                                  peer_name(comm_, r), timeout_cause_note()));
    }
  }
}

void HostCollectives::publish_and_wait(std::uint64_t call, const char* what) {
  publish(call);
  Poller poller(timeout_s_);  // one deadline for the whole wait
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) wait_for(r, call, poller, what);
  }
}

void HostCollectives::all_reduce_sum(float* data, std::size_t count) {
  for (std::size_t offset = 0; offset < count; offset += kSlotFloats) {
    const std::size_t n = std::min(kSlotFloats, count - offset);
    const std::uint64_t call = calls_ + 1;
    std::memcpy(slot(rank_, call), data + offset, n * sizeof(float));
    publish_and_wait(call, "all-reduce");
    float* out = data + offset;
    std::memcpy(out, slot(0, call), n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* in = slot(r, call);
      for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
    }
    calls_ = call;
  }
}

void HostCollectives::all_gather_v(const float* send, float* recv, const std::vector<int>& counts) {
  SL_CHECK(static_cast<int>(counts.size()) == size_);
  const std::size_t most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  // Round j moves elements [j * kSlotFloats, (j + 1) * kSlotFloats) of every rank's part.
  for (std::size_t offset = 0; offset < most; offset += kSlotFloats) {
    const std::uint64_t call = calls_ + 1;
    auto part = [&](int r) { return std::min(kSlotFloats, std::max<std::size_t>(counts[r], offset) - offset); };
    if (part(rank_) > 0) std::memcpy(slot(rank_, call), send + offset, part(rank_) * sizeof(float));
    publish_and_wait(call, "all-gather");
    std::size_t at = 0;  // rank r's part starts after the parts of the ranks before it
    for (int r = 0; r < size_; ++r) {
      if (part(r) > 0) std::memcpy(recv + at + offset, slot(r, call), part(r) * sizeof(float));
      at += static_cast<std::size_t>(counts[r]);
    }
    calls_ = call;
  }
}

void HostCollectives::all_gather_bytes(const void* send, std::size_t bytes_each, void* recv) {
  const auto* mine = static_cast<const std::byte*>(send);
  auto* all = static_cast<std::byte*>(recv);
  for (std::size_t offset = 0; offset < bytes_each; offset += kSlotBytes) {
    const std::uint64_t call = calls_ + 1;
    const std::size_t n = std::min(kSlotBytes, bytes_each - offset);
    std::memcpy(slot(rank_, call), mine + offset, n);
    publish_and_wait(call, "all-gather");
    for (int r = 0; r < size_; ++r) std::memcpy(all + static_cast<std::size_t>(r) * bytes_each + offset, slot(r, call), n);
    calls_ = call;
  }
}

void HostCollectives::ordered_sum(float* data, std::size_t count, Communicator::AddOwn add_own) {
  const int last = size_ - 1;
  for (std::size_t offset = 0; offset < count; offset += kSlotFloats) {
    const std::size_t n = std::min(kSlotFloats, count - offset);
    const std::uint64_t call = calls_ + 1;
    float* y = data + offset;
    Poller poller(timeout_s_);
    if (rank_ > 0) {
      wait_for(rank_ - 1, call, poller, "tensor-parallel sum");
      std::memcpy(y, slot(rank_ - 1, call), n * sizeof(float));
      add_own(y, offset, n);
    }
    std::memcpy(slot(rank_, call), y, n * sizeof(float));
    publish(call);
    if (rank_ != last) {
      wait_for(last, call, poller, "tensor-parallel sum");
      std::memcpy(y, slot(last, call), n * sizeof(float));
    }
    calls_ = call;
  }
}

}  // namespace shardline::comm
