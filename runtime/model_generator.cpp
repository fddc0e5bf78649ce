#include "runtime/model_generator.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "common/units.h"
#include "partition/model_presets.h"
#include "runtime/checkpoint.h"
#include "runtime/tokenizer.h"

namespace shardline::runtime {

namespace {

namespace fs = std::filesystem;

// splitmix64: a fast, well-mixed stream; one per tensor so the output does not depend on write order.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& path, std::uint64_t total_bytes, const ProgressCallback& progress)
      : path_(path), total_bytes_(total_bytes), progress_(progress) {
    file_ = std::fopen(path.c_str(), "wb");
    if (!file_) throw ResourceError(fmt::format("cannot create '{}': {}", path, std::strerror(errno)));
  }
  ~CheckpointWriter() {
    if (file_) std::fclose(file_);
  }
  void bytes(const void* data, std::size_t n) {
    if (std::fwrite(data, 1, n, file_) != n) {
      throw ResourceError(fmt::format("writing '{}' failed (disk full?): {}", path_, std::strerror(errno)));
    }
    written_ += n;
    if (progress_) progress_(written_, total_bytes_);
  }
  // n floats uniform with standard deviation `stddev` (uniform on [-a, a] has std a / sqrt(3)).
  void random(std::uint64_t n, float stddev, std::uint64_t stream) {
    SplitMix64 rng{stream * 0xD1B54A32D192ED03ull};
    const float a = stddev * std::sqrt(3.0f);
    std::vector<float> buffer(1 << 20);
    while (n > 0) {
      const std::size_t m = n < buffer.size() ? n : buffer.size();
      for (std::size_t i = 0; i < m; ++i) buffer[i] = a * rng.uniform();
      bytes(buffer.data(), m * sizeof(float));
      n -= m;
    }
  }
  void constant(std::uint64_t n, float value) {
    std::vector<float> buffer(n < (1u << 20) ? n : (1u << 20), value);
    while (n > 0) {
      const std::size_t m = n < buffer.size() ? n : buffer.size();
      bytes(buffer.data(), m * sizeof(float));
      n -= m;
    }
  }
  void close() {
    if (std::fclose(file_) != 0) throw ResourceError(fmt::format("closing '{}' failed", path_));
    file_ = nullptr;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::uint64_t total_bytes_;
  std::uint64_t written_ = 0;
  ProgressCallback progress_;
};

// This host's name, in part files' names: on a folder several hosts share, a part file's process number
// means something only on the host that wrote it.
std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "host";
  std::string host(name);
  for (char& c : host) {
    if (c == '.' || c == '/') c = '_';  // one field of the part file's name
  }
  return host;
}

// "<path>.tmp.<host>.<pid>.<n>": written, then renamed into place.
std::string temp_name(const std::string& path) {
  return fmt::format("{}.tmp.{}.{}.{}", path, host_name(), ::getpid(), reinterpret_cast<std::uintptr_t>(&path) & 0xffff);
}

// Whether `rest` (a part file's name after "<file>.tmp.<host>.") is "<pid>.<n>", both all digits, and its
// pid a possible process number.
bool part_file_pid(const std::string& rest, long& pid) {
  const std::size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string::npos || dot + 1 == rest.size() || dot > 10) return false;
  if (rest.find_first_not_of("0123456789") != dot || rest.find_first_not_of("0123456789", dot + 1) != std::string::npos) {
    return false;
  }
  pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
  return pid > 0 && pid <= std::numeric_limits<int>::max();
}

// Removes the part files of `path` that a process of this host left when it was killed outright (SIGKILL, an
// out-of-memory kill, a power cut), which no handler could clean up: a killed 70B model's part file holds
// hundreds of GB. A writer holds an exclusive flock() on its part file from creating it until it ends (the
// kernel drops it with the process, however it ends), so a part file this process can lock has no writer;
// its process number must also be gone here (kill(pid, 0): ESRCH). A lock is what tells a live writer in
// another PID namespace of this host (containers sharing the host's name: every rank of a `run` writes the
// default model's cache at once) from a dead one. Another host's part files and anything not named as
// temp_name() names them stay; so does everything when the folder cannot be read.
void remove_stale_part_files(const std::string& path) {
  const fs::path final_path = fs::absolute(path);
  const std::string prefix = final_path.filename().string() + ".tmp." + host_name() + ".";
  std::error_code ec;
  for (fs::directory_iterator it(final_path.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path candidate = it->path();
    const std::string name = candidate.filename().string();
    long pid = 0;
    if (!name.starts_with(prefix) || !part_file_pid(name.substr(prefix.size()), pid)) continue;
    if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const int fd = ::open(candidate.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;  // gone already, a link, or not ours to open
    struct stat st {};
    const bool stale = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (stale && ::unlink(candidate.c_str()) == 0) {
      log::info("removed '{}' ({:.1f} MiB), the part file of a writer (process {}) that was killed before it finished",
                candidate.string(), static_cast<double>(st.st_size) / (1024.0 * 1024.0), pid);
    }
    ::close(fd);
  }
}

// Part files that Ctrl-C (or SIGTERM, SIGHUP) during a long write would leave behind: their paths, where
// a signal handler may read them. The handler unlinks them, then lets the signal end the process as it
// would have. It is installed only over the default action (a launcher's or library's handler is kept).
constexpr int kPartFileSlots = 2;  // a model and its tokenizer
constexpr std::size_t kPartPathBytes = 4096;
constexpr int kPartFileSignals[] = {SIGINT, SIGTERM, SIGHUP};
char part_files[kPartFileSlots][kPartPathBytes];
volatile std::sig_atomic_t part_file_used[kPartFileSlots];

extern "C" void remove_part_files_and_end(int signal) {
  for (int i = 0; i < kPartFileSlots; ++i) {
    if (part_file_used[i]) ::unlink(part_files[i]);
  }
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// The slot that now holds `path`, or -1 (no slot free, or a path too long to keep).
int watch_part_file(const std::string& path) {
  if (path.size() >= kPartPathBytes) return -1;
  for (int i = 0; i < kPartFileSlots; ++i) {
    if (part_file_used[i]) continue;
    std::memcpy(part_files[i], path.c_str(), path.size() + 1);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the whole path before the handler may read it
    part_file_used[i] = 1;
    for (const int signal : kPartFileSignals) {
      struct sigaction current {};
      if (::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
        std::signal(signal, remove_part_files_and_end);
      }
    }
    return i;
  }
  return -1;
}

void unwatch_part_file(int slot) {
  if (slot < 0) return;
  part_file_used[slot] = 0;
  for (int i = 0; i < kPartFileSlots; ++i) {
    if (part_file_used[i]) return;
  }
  for (const int signal : kPartFileSignals) {  // nothing left to remove: the default action again
    struct sigaction current {};
    if (::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == remove_part_files_and_end) {
      std::signal(signal, SIG_DFL);
    }
  }
}

// A file written under a temporary name: removed unless it was renamed into place, so a failed write (a
// full disk, a bad shape found late, a Ctrl-C) leaves nothing behind.
class TempFile {
 public:
  // Creates the part file and holds an exclusive flock() on it until the object ends (the writers open it
  // again by name): remove_stale_part_files() leaves a locked part file alone.
  explicit TempFile(const std::string& final_path)
      : final_(final_path), temp_(temp_name(final_path)), slot_(watch_part_file(temp_)) {
    lock_fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) {
      const int error = errno;
      unwatch_part_file(slot_);
      throw ResourceError(fmt::format("cannot create '{}': {}", temp_, std::strerror(error)));
    }
    ::flock(lock_fd_, LOCK_EX);  // a file system without locks leaves it unlocked: only SIGKILLed writers differ
  }
  ~TempFile() {
    std::error_code ignored;
    if (!kept_) fs::remove(temp_, ignored);
    ::close(lock_fd_);
    unwatch_part_file(slot_);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return temp_; }
  void keep() {
    std::error_code ec;
    fs::rename(temp_, final_, ec);
    if (ec) throw ResourceError(fmt::format("cannot move '{}' to '{}': {}", temp_, final_, ec.message()));
    kept_ = true;
  }

 private:
  std::string final_, temp_;
  int slot_ = -1;
  int lock_fd_ = -1;
  bool kept_ = false;
};

// Refuses a file whose folder is missing or cannot hold it, before writing a byte of it: a mistyped shape
// would otherwise fill the disk and then fail.
void check_destination(const std::string& path, std::uint64_t bytes) {
  const fs::path dir = fs::absolute(path).parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ResourceError(fmt::format("cannot write '{}': its folder '{}' {}", path, dir.string(),
                                    fs::exists(dir, ec) ? "is not a folder" : "does not exist"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {  // (a read-only file system read as one without free space)
    throw ResourceError(fmt::format("cannot write '{}': its folder '{}' is not writable: {}", path, dir.string(),
                                    std::strerror(errno)));
  }
  const fs::space_info space = fs::space(dir, ec);
  if (ec || space.available >= bytes) return;  // unknown: let the write say what went wrong
  throw ResourceError(fmt::format("'{}' would need {} but its folder has {} free; free space or choose another folder",
                                  path, format_bytes(static_cast<double>(bytes)),
                                  format_bytes(static_cast<double>(space.available))));
}

}  // namespace

void prepare_model_destinations(const partition::ModelShape& s, const GeneratedModelPaths& paths) {
  if (auto problem = s.find_problem()) throw ConfigError(fmt::format("cannot generate this model: {}", *problem));
  remove_stale_part_files(paths.model);  // before the free space is checked: theirs counts
  remove_stale_part_files(paths.tokenizer);
  check_destination(paths.model, checkpoint_layout(s).total_bytes);
  check_destination(paths.tokenizer, 0);
}

void generate_model(const partition::ModelShape& s, std::uint64_t seed, const GeneratedModelPaths& paths,
                    const ProgressCallback& progress) {
  prepare_model_destinations(s, paths);
  const CheckpointLayout layout = checkpoint_layout(s);
  // The tokenizer first (it is small, and its folder may be another one), renamed into place last: a
  // failure anywhere before leaves neither file changed.
  TempFile tokenizer(paths.tokenizer);
  make_synthetic_tokenizer(s.vocab_size).save(tokenizer.path());
  TempFile model(paths.model);
  {
    CheckpointWriter out(model.path(), layout.total_bytes, progress);
    std::int32_t header[7];
    encode_checkpoint_header(s, header);
    out.bytes(header, sizeof(header));
    const std::uint64_t L = s.n_layers, d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
    const float in_dim = 1.0f / std::sqrt(static_cast<float>(d));
    const float in_hidden = 1.0f / std::sqrt(static_cast<float>(h));
    // Layers must move the residual stream well away from the token's own embedding; with unit gains a
    // tied classifier mostly predicts the input token again and greedy output repeats one token.
    constexpr float kResidualGain = 3.0f;
    std::uint64_t stream = seed * 1000;
    out.random(v * d, 1.0f, ++stream);            // token_embedding
    out.constant(L * d, 1.0f);                    // rms_att
    out.random(L * d * d, in_dim, ++stream);      // wq
    out.random(L * kv * d, in_dim, ++stream);     // wk
    out.random(L * kv * d, in_dim, ++stream);     // wv
    out.random(L * d * d, kResidualGain * in_dim, ++stream);     // wo
    out.constant(L * d, 1.0f);                    // rms_ffn
    out.random(L * h * d, in_dim, ++stream);      // w1
    out.random(L * d * h, kResidualGain * in_hidden, ++stream);  // w2
    out.random(L * h * d, in_dim, ++stream);      // w3
    out.constant(d, 1.0f);                        // rms_final
    out.constant(2 * static_cast<std::uint64_t>(s.seq_len) * (s.head_size() / 2), 0.0f);  // unused RoPE tables
    // A classifier gain of 4 spreads the logits so greedy decoding has clear winners.
    if (!s.shared_classifier) out.random(v * d, 4.0f * in_dim, ++stream);
    out.close();
  }
  model.keep();
  tokenizer.keep();
}

std::string default_tokenizer_path_for(const std::string& model_path) {
  std::string stem = model_path;
  if (stem.size() > 4 && stem.ends_with(".bin")) stem.resize(stem.size() - 4);
  return stem + ".tokenizer.bin";
}

std::string cache_dir() {
  fs::path dir;
  if (const char* env = std::getenv("SHARDLINE_CACHE_DIR"); env && *env) {
    dir = env;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    dir = fs::path(xdg) / "shardline";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = fs::path(home) / ".cache" / "shardline";
  } else {
    dir = fs::temp_directory_path() / "shardline";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ResourceError(fmt::format("cannot create the cache folder '{}': {}", dir.string(), ec.message()));
  return dir.string();
}

GeneratedModelPaths ensure_generated_model(const partition::ModelShape& shape, std::uint64_t seed,
                                           const std::string& dir, const std::string& name, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ResourceError(fmt::format("cannot create the model folder '{}': {}", dir, ec.message()));
  GeneratedModelPaths paths{(fs::path(dir) / (name + ".bin")).string(), ""};
  paths.tokenizer = default_tokenizer_path_for(paths.model);
  // A cached file that is not this shape's (cut short or changed since, another shape under the name) is
  // made again rather than failing every later run. Writes are renamed into place whole, so a file whose
  // header is this shape and whose size the header's (read_checkpoint_shape checks both) is one this
  // generator wrote (same seed per name: bench's and the default's). The tokenizer too: one cut short failed
  // every run after it, naming a cache file the user never gave.
  const bool present = fs::exists(paths.model, ec) && fs::exists(paths.tokenizer, ec);
  bool stale = false;
  if (present) {
    try {
      stale = read_checkpoint_shape(paths.model) != shape;
      if (!stale) Tokenizer(paths.tokenizer, shape.vocab_size);
    } catch (const Error&) {
      stale = true;  // cut short, or an unreadable header
    }
    if (stale) {
      log::warn("{} at '{}' (or its tokenizer) is not this shape's any more: generating it again", what, paths.model);
    }
  }
  if (!present || stale) {
    log::info("generating {} ({}, random weights) into {}", what, shape.describe(), paths.model);
    generate_model(shape, seed, paths);
  }
  return paths;
}

GeneratedModelPaths ensure_default_model() {
  // The 15m shape with its own classifier: a tied random classifier mostly predicts the input token again,
  // and a default that prints one token over and over looks broken.
  partition::ModelShape shape = partition::find_model_preset("15m").shape;
  shape.shared_classifier = false;
  return ensure_generated_model(shape, 42, cache_dir(), "default-15m-unshared-seed42", "the built-in default model");
}

}  // namespace shardline::runtime
