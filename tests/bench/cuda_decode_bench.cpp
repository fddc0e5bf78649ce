// Decode-step proxy on one GPU, against the CPU kernels and the device's own copy bandwidth, all measured in
// the same run. One "token" runs a Llama layer stack's decode ops on one sequence: RMSNorm, the q/k/v/o
// GEMVs, RoPE, paged attention over `context` cached positions, the residuals, w1/w3/SwiGLU/w2, then the
// final norm, the classifier and argmax, with a host synchronisation per token as a real decode loop has.
// Weights are random (speed does not depend on values) and each layer has its own device copy, so nothing
// is served from L2 across layers.
//
//   cuda_decode_bench [--dim 4096] [--hidden 11008] [--layers 8] [--heads 32] [--kv-heads 32]
//                     [--vocab 32000] [--context 512] [--tokens 50] [--cpu-tokens 3] [--cpu-threads N]
//
// Prints a table, then "RESULT key=value" lines that scripts/gpu-check.sh collects.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#include "tests/support/packed_weights.h"

namespace cuda = shardline::kernels::cuda;
namespace cpu = shardline::kernels::cpu;

namespace {

struct Shape {
  int dim = 4096;
  int hidden = 11008;
  int layers = 8;
  int heads = 32;
  int kv_heads = 32;
  int vocab = 32000;
  int context = 512;
  int tokens = 50;
  int cpu_tokens = 3;
  int cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  int head_size() const { return dim / heads; }
  int kv_dim() const { return kv_heads * head_size(); }
  // Weight floats of one layer and of the whole stack (classifier included).
  std::size_t layer_floats() const {
    return static_cast<std::size_t>(dim) * (2 * dim + 2 * kv_dim()) + 3 * static_cast<std::size_t>(hidden) * dim;
  }
  std::size_t weight_floats() const { return layers * layer_floats() + static_cast<std::size_t>(vocab) * dim; }
};

Shape parse(int argc, char** argv) {
  Shape s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--dim") s.dim = value;
    else if (flag == "--hidden") s.hidden = value;
    else if (flag == "--layers") s.layers = value;
    else if (flag == "--heads") s.heads = value;
    else if (flag == "--kv-heads") s.kv_heads = value;
    else if (flag == "--vocab") s.vocab = value;
    else if (flag == "--context") s.context = value;
    else if (flag == "--tokens") s.tokens = value;
    else if (flag == "--cpu-tokens") s.cpu_tokens = value;
    else if (flag == "--cpu-threads") s.cpu_threads = value;
    else throw shardline::ConfigError("unknown flag " + flag + " (see the comment at the top of cuda_decode_bench.cpp)");
  }
  if (s.dim % s.heads != 0 || s.heads % s.kv_heads != 0 || s.head_size() % 2 != 0) {
    throw shardline::ConfigError("dim must split into an even head size, heads into kv heads");
  }
  return s;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {  // xorshift: fast enough for gigabytes, values in [-0.05, 0.05)
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    x = (static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 0.1f;
  }
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Host copies of one layer's weights (every layer of the CPU run uses these: the stack is far larger than
// any cache, so re-reading them costs what distinct layers would) and the classifier.
struct HostWeights {
  std::vector<float> wq, wk, wv, wo, w1, w2, w3, norm, classifier;
  explicit HostWeights(const Shape& s)
      : wq(random_floats(static_cast<std::size_t>(s.dim) * s.dim, 1)),
        wk(random_floats(static_cast<std::size_t>(s.kv_dim()) * s.dim, 2)),
        wv(random_floats(static_cast<std::size_t>(s.kv_dim()) * s.dim, 3)),
        wo(random_floats(static_cast<std::size_t>(s.dim) * s.dim, 4)),
        w1(random_floats(static_cast<std::size_t>(s.hidden) * s.dim, 5)),
        w2(random_floats(static_cast<std::size_t>(s.dim) * s.hidden, 6)),
        w3(random_floats(static_cast<std::size_t>(s.hidden) * s.dim, 7)),
        norm(s.dim, 1.0f),
        classifier(random_floats(static_cast<std::size_t>(s.vocab) * s.dim, 8)) {}
};

struct DeviceLayer {
  cuda::DeviceMatrix wq, wk, wv, wo, w1, w2, w3;
};

struct GpuSpeeds {
  double eager_tok_s = 0;  // every kernel launched from the host each token
  double graph_tok_s = 0;  // the whole step replayed from one CUDA graph
};

GpuSpeeds gpu_tok_s(const Shape& s, const HostWeights& host, cuda::DeviceDtype dtype) {
  std::vector<DeviceLayer> layers;
  for (int l = 0; l < s.layers; ++l) {
    layers.push_back({cuda::DeviceMatrix::upload(host.wq.data(), s.dim, s.dim, s.dim, dtype),
                      cuda::DeviceMatrix::upload(host.wk.data(), s.dim, s.kv_dim(), s.dim, dtype),
                      cuda::DeviceMatrix::upload(host.wv.data(), s.dim, s.kv_dim(), s.dim, dtype),
                      cuda::DeviceMatrix::upload(host.wo.data(), s.dim, s.dim, s.dim, dtype),
                      cuda::DeviceMatrix::upload(host.w1.data(), s.dim, s.hidden, s.dim, dtype),
                      cuda::DeviceMatrix::upload(host.w2.data(), s.hidden, s.dim, s.hidden, dtype),
                      cuda::DeviceMatrix::upload(host.w3.data(), s.dim, s.hidden, s.dim, dtype)});
  }
  const cuda::DeviceMatrix classifier = cuda::DeviceMatrix::upload(host.classifier.data(), s.dim, s.vocab, s.dim, dtype);
  cuda::DeviceBuffer norm(s.dim * 4);
  cuda::copy_to_device(norm.data(), host.norm.data(), s.dim * 4);

  // The paged KV cache: one sequence holding `context` positions in 16-token blocks.
  const int block_tokens = 16;
  const int n_blocks = (s.context + block_tokens - 1) / block_tokens;
  const std::size_t block_floats = static_cast<std::size_t>(s.layers) * 2 * block_tokens * s.kv_dim();
  cuda::Stream stream;
  cuda::DeviceBuffer pool(n_blocks * block_floats * 4);
  cuda::fill_zero_async(pool.data(), pool.bytes(), stream.ref());
  std::vector<int> table(n_blocks);
  for (int b = 0; b < n_blocks; ++b) table[b] = n_blocks - 1 - b;  // not in order, as a real pool's
  cuda::DeviceBuffer d_table(n_blocks * 4), d_zero(4), d_ctx(4), d_pos(4);
  cuda::copy_to_device(d_table.data(), table.data(), n_blocks * 4);
  const int zero = 0, pos = s.context - 1, n_ctx = s.context;
  cuda::copy_to_device(d_zero.data(), &zero, 4);
  cuda::copy_to_device(d_ctx.data(), &n_ctx, 4);
  cuda::copy_to_device(d_pos.data(), &pos, 4);

  cuda::DeviceBuffer x(s.dim * 4), xb(s.dim * 4), q(s.dim * 4), k(s.kv_dim() * 4), v(s.kv_dim() * 4),
      att(s.dim * 4), h1(s.hidden * 4), h3(s.hidden * 4), logits(s.vocab * 4), token(4),
      scratch(static_cast<std::size_t>(s.heads) * s.context * 4);
  cuda::fill_zero_async(x.data(), x.bytes(), stream.ref());
  cuda::Blas blas(cuda::BlasOptions{1, std::max(s.dim, s.hidden)});
  const cuda::StreamRef st = stream.ref();

  auto step = [&] {
    for (int l = 0; l < s.layers; ++l) {
      const DeviceLayer& w = layers[l];
      cuda::rmsnorm(xb.as<float>(), x.as<float>(), norm.as<float>(), 1, s.dim, 1e-5f, st);
      blas.matmul(q.as<float>(), xb.as<float>(), w.wq.view(), 1, st);
      blas.matmul(k.as<float>(), xb.as<float>(), w.wk.view(), 1, st);
      blas.matmul(v.as<float>(), xb.as<float>(), w.wv.view(), 1, st);
      cuda::rope(q.as<float>(), d_pos.as<int>(), 1, s.heads, s.head_size(), 10000.0f, nullptr, st);
      cuda::rope(k.as<float>(), d_pos.as<int>(), 1, s.kv_heads, s.head_size(), 10000.0f, nullptr, st);
      cuda::PagedAttention a;
      a.out = att.as<float>();
      a.q = q.as<float>();
      a.kv_pool = pool.as<float>();
      a.block_floats = block_floats;
      a.layer = l;
      a.block_tokens = block_tokens;
      a.block_tables = d_table.as<int>();
      a.max_blocks_per_table = n_blocks;
      a.query_table = d_zero.as<int>();
      a.query_n_ctx = d_ctx.as<int>();
      a.n_heads = s.heads;
      a.n_kv_heads = s.kv_heads;
      a.head_size = s.head_size();
      a.kv_stride = s.kv_dim();
      a.max_ctx = s.context;
      a.scratch = scratch.as<float>();
      cuda::attention_paged(a, st);
      blas.matmul(xb.as<float>(), att.as<float>(), w.wo.view(), 1, st);
      cuda::add_inplace(x.as<float>(), xb.as<float>(), s.dim, st);
      cuda::rmsnorm(xb.as<float>(), x.as<float>(), norm.as<float>(), 1, s.dim, 1e-5f, st);
      blas.matmul(h1.as<float>(), xb.as<float>(), w.w1.view(), 1, st);
      blas.matmul(h3.as<float>(), xb.as<float>(), w.w3.view(), 1, st);
      cuda::swiglu(h1.as<float>(), h3.as<float>(), s.hidden, st);
      blas.matmul(xb.as<float>(), h1.as<float>(), w.w2.view(), 1, st);
      cuda::add_inplace(x.as<float>(), xb.as<float>(), s.dim, st);
    }
    cuda::rmsnorm(xb.as<float>(), x.as<float>(), norm.as<float>(), 1, s.dim, 1e-5f, st);
    blas.matmul(logits.as<float>(), xb.as<float>(), classifier.view(), 1, st);
    cuda::argmax(token.as<int>(), logits.as<float>(), 1, s.vocab, st);
  };

  cuda::Graph graph;
  auto tokens_per_s = [&](bool use_graph) {
    auto one_token = [&] {
      if (use_graph) {
        graph.launch(st);
      } else {
        step();
      }
      stream.synchronize();  // a decode loop needs the token on the host before the next step
    };
    for (int i = 0; i < 3; ++i) one_token();  // warm-up: cuBLAS heuristics, caches, clocks
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < s.tokens; ++i) one_token();
    return s.tokens / seconds_since(start);
  };
  GpuSpeeds speeds;
  speeds.eager_tok_s = tokens_per_s(false);
  graph = cuda::Graph::capture(stream, step);
  speeds.graph_tok_s = tokens_per_s(true);
  return speeds;
}

double cpu_tok_s(const Shape& s, const HostWeights& w) {
  cpu::set_num_threads(s.cpu_threads);
  // The CPU backend's matmul: fp32 weights packed as the runtime packs them (before the clock starts).
  const auto pack = [](const std::vector<float>& m, int d, int k) {
    return shardline::test::pack_row_major(cpu::WeightDtype::kF32, m.data(), d, k);
  };
  const shardline::test::PackedWeights wq = pack(w.wq, s.dim, s.dim), wk = pack(w.wk, s.kv_dim(), s.dim),
                                       wv = pack(w.wv, s.kv_dim(), s.dim), wo = pack(w.wo, s.dim, s.dim),
                                       w1 = pack(w.w1, s.hidden, s.dim), w2 = pack(w.w2, s.dim, s.hidden),
                                       w3 = pack(w.w3, s.hidden, s.dim), classifier = pack(w.classifier, s.vocab, s.dim);
  cpu::Activations activations;
  activations.reserve(1, std::max(s.dim, s.hidden));
  auto matmul = [&](float* y, const float* x, const shardline::test::PackedWeights& m) {
    activations.prepare(x, 1, m.matrix.k, cpu::WeightDtype::kF32);
    cpu::matmul(y, activations, m.matrix);
  };
  std::vector<float> x(s.dim, 0.01f), xb(s.dim), q(s.dim), k(s.kv_dim()), v(s.kv_dim()), att(s.dim), h1(s.hidden),
      h3(s.hidden), logits(s.vocab), scratch(static_cast<std::size_t>(s.heads) * s.context);
  std::vector<float> k_cache(static_cast<std::size_t>(s.context) * s.kv_dim(), 0.0f), v_cache(k_cache);
  auto step = [&] {
    for (int l = 0; l < s.layers; ++l) {
      cpu::rmsnorm(xb.data(), x.data(), w.norm.data(), 1, s.dim, 1e-5f);
      matmul(q.data(), xb.data(), wq);
      matmul(k.data(), xb.data(), wk);
      matmul(v.data(), xb.data(), wv);
      cpu::rope(q.data(), s.heads, s.head_size(), s.context - 1, 10000.0f);
      cpu::rope(k.data(), s.kv_heads, s.head_size(), s.context - 1, 10000.0f);
      cpu::attention(att.data(), q.data(), k_cache.data(), v_cache.data(), scratch.data(), s.context, s.heads,
                     s.kv_heads, s.head_size(), s.kv_dim());
      matmul(xb.data(), att.data(), wo);
      cpu::add_inplace(x.data(), xb.data(), s.dim);
      cpu::rmsnorm(xb.data(), x.data(), w.norm.data(), 1, s.dim, 1e-5f);
      matmul(h1.data(), xb.data(), w1);
      matmul(h3.data(), xb.data(), w3);
      cpu::swiglu(h1.data(), h3.data(), s.hidden);
      matmul(xb.data(), h1.data(), w2);
      cpu::add_inplace(x.data(), xb.data(), s.dim);
    }
    cpu::rmsnorm(xb.data(), x.data(), w.norm.data(), 1, s.dim, 1e-5f);
    matmul(logits.data(), xb.data(), classifier);
    return cpu::argmax(logits.data(), s.vocab);
  };
  step();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < s.cpu_tokens; ++i) step();
  return s.cpu_tokens / seconds_since(start);
}

// Device-to-device copy bandwidth (bytes read + written per second): the roofline a decode step that
// streams its weights once can approach.
double copy_gbps() {
  const std::size_t bytes = std::size_t{1} << 30;
  cuda::DeviceBuffer a(bytes), b(bytes);
  cuda::Stream stream;
  cuda::copy_device_to_device_async(b.data(), a.data(), bytes, stream.ref());
  stream.synchronize();
  const int repeats = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) cuda::copy_device_to_device_async(b.data(), a.data(), bytes, stream.ref());
  stream.synchronize();
  return 2.0 * bytes * repeats / seconds_since(start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Shape s = parse(argc, argv);
    const cuda::DeviceCount devices = cuda::device_count();
    if (devices.count == 0) {
      std::fprintf(stderr, "cuda_decode_bench: no CUDA device: %s\n", devices.reason.c_str());
      return static_cast<int>(shardline::ExitCode::kResource);
    }
    cuda::select_device(0);
    const cuda::DeviceProperties props = cuda::device_properties(0);
    const double fp32_gb = s.weight_floats() * 4.0 / 1e9;
    std::printf("device: %s (sm_%d%d, %.0f GB)\n", props.name.c_str(), props.sm_major, props.sm_minor,
                props.memory_bytes / 1e9);
    std::printf("decode proxy: dim %d, hidden %d, %d layers, %d/%d heads, vocab %d, context %d; weights %.2f GB "
                "fp32, %.2f GB bf16\n",
                s.dim, s.hidden, s.layers, s.heads, s.kv_heads, s.vocab, s.context, fp32_gb, fp32_gb / 2);
    const HostWeights host(s);
    const double copy = copy_gbps();
    const double cpu = cpu_tok_s(s, host);
    struct Row {
      const char* name;
      double tok_s;
      double weight_gb;
    };
    std::vector<Row> rows = {{"cpu fp32", cpu, fp32_gb}};
    const GpuSpeeds fp32 = gpu_tok_s(s, host, cuda::DeviceDtype::kF32);
    const GpuSpeeds bf16 = gpu_tok_s(s, host, cuda::DeviceDtype::kBf16);
    rows.push_back({"gpu fp32 eager", fp32.eager_tok_s, fp32_gb});
    rows.push_back({"gpu fp32 graph", fp32.graph_tok_s, fp32_gb});
    rows.push_back({"gpu bf16 eager", bf16.eager_tok_s, fp32_gb / 2});
    rows.push_back({"gpu bf16 graph", bf16.graph_tok_s, fp32_gb / 2});
    std::printf("\ndevice copy bandwidth (read + write): %.0f GB/s; CPU baseline: %d threads\n", copy, s.cpu_threads);
    std::printf("%-16s %10s %14s %10s %16s\n", "path", "tok/s", "weights GB/s", "vs cpu", "vs copy bw");
    for (const Row& r : rows) {
      const double gbps = r.tok_s * r.weight_gb;
      std::printf("%-16s %10.1f %14.0f %9.1fx %15.2f\n", r.name, r.tok_s, gbps, r.tok_s / cpu, gbps / copy);
    }
    std::printf("\nRESULT copy_gbps=%.0f\n", copy);
    for (const Row& r : rows) {
      std::string key = r.name;
      for (char& c : key) c = c == ' ' ? '_' : c;
      std::printf("RESULT %s_tok_s=%.1f\n", key.c_str(), r.tok_s);
    }
    return 0;
  } catch (const shardline::Error& e) {
    std::fprintf(stderr, "cuda_decode_bench: error: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
