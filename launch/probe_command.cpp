#include "launch/probe_command.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/link_probe.h"
#include "comm/mpi_communicator.h"
#include "common/error.h"
#include "common/log.h"
#include "common/output_file.h"
#include "launch/agreed_fields.h"
#include "launch/cli_options.h"
#include "launch/field_agreement.h"
#include "partition/cluster.h"
#include "runtime/machine_probe.h"

namespace shardline::launch {

namespace {

nlohmann::json fit_json(const comm::LinkFit& f) {
  return {{"measured", f.measured}, {"alpha_s", f.alpha_s}, {"beta_s_per_byte", f.beta_s_per_byte},
          {"bandwidth_bytes_per_s", f.beta_s_per_byte > 0 ? 1.0 / f.beta_s_per_byte : 0.0}};
}

void print_link(const char* name, const comm::LinkFit& f, const partition::LinkCost& used) {
  std::cout << fmt::format("  {:<28} {:>10.2f} us {:>10.2f} GB/s   {}\n", name, used.alpha_s * 1e6,
                           used.bandwidth_bytes_per_s() / 1e9, f.measured ? "measured" : "not measured (default)");
}

}  // namespace

int probe_command(const std::vector<std::string>& args, const MpiSession& mpi) {
  std::string out = "shardline-probe.json";
  bool quick = false;
  po::options_description options("probe options");
  options.add_options()
      ("out,o", po::value(&out)->default_value(out), "where to write the cluster profile (JSON, for `plan --probe-file`)")
      ("quick", po::bool_switch(&quick), "fewer repetitions and a smaller buffer (about two seconds, not four)");
  po::variables_map vm;
  const std::string usage =
      "Usage: mpirun -np N [--hostfile H] shardline probe [--out FILE]\n\n"
      "Measures point-to-point latency and bandwidth between ranks on one host and across hosts, the\n"
      "all-reduce over all ranks, and this host: weight-streaming bandwidth and GEMM rate for fp32, bf16 and\n"
      "int8 weights, the cache they get, fixed costs (kernel call, barrier, row work, attention head) and\n"
      "attention's rate over a prompt; writes a cluster profile for `shardline plan --probe-file`. Without\n"
      "mpirun only the host is measured.";
  // Start-up checks run on every rank; the ranks agree on the outcome and one of them says why (each rank
  // printed its own copy of a bad flag, and mpirun its abort banner).
  bool help = false;
  const int code = agreed_phase(mpi, kDefaultCommTimeoutS, [&] {
    help = !parse_command_line("probe", usage, options, args, vm, mpi.world_rank() == 0);
    // The profile's file is checked before the measurement (seconds of it), by the rank that writes it.
    if (!help && mpi.world_rank() == 0) require_writable_output(out, "--out file");
  });
  if (code != 0) return code;
  // Every rank measures the same way (a rank with --quick exchanged smaller messages than its peers: "message
  // truncated"); --out is rank 0's alone.
  const int agreed = agreed_phase(mpi, kDefaultCommTimeoutS, [&] {
    require_same_fields(mpi, kDefaultCommTimeoutS, help, [&] { return AgreedFields{{"--quick", given(quick)}}; },
                        "give every rank the same probe flags");
  });
  if (agreed != 0) return agreed;
  if (help) return 0;
  std::unique_ptr<comm::Communicator> world =
      mpi.active() ? comm::make_mpi_world({.timeout_s = kDefaultCommTimeoutS, .host_collectives = true})  // as a run's groups
                   : comm::make_solo_communicator();
  const comm::LinkProbeResult links = comm::probe_links(*world, {quick});
  partition::ClusterSpec cluster;
  if (world->rank() == 0) {
    // The host's compute is measured by rank 0 alone while the others wait, so it gets the whole host.
    cluster = runtime::probe_this_machine({quick, 0});
  }
  world->idle_barrier();  // the others poll every few ms meanwhile, off the cores being measured
  if (world->rank() != 0) return 0;

  int on_host = 0;
  for (const auto& h : links.hosts) on_host += h == links.hosts[0] ? 1 : 0;
  cluster.name = fmt::format("probe:{}", links.hosts[0]) + (links.n_hosts > 1 ? fmt::format("+{}", links.n_hosts - 1) : "");
  cluster.nodes = links.n_hosts;
  cluster.domains_per_node = 1;  // NUMA domains are not told apart by this probe (see docs/planner.md)
  cluster.ranks_per_domain = std::max(on_host, cluster.domain.cores);
  cluster.domain.cores = std::max<int>(cluster.domain.cores, std::thread::hardware_concurrency());
  if (links.same_host.measured) {
    cluster.same_domain = {links.same_host.alpha_s, links.same_host.beta_s_per_byte};
    cluster.cross_domain = cluster.same_domain;
  }
  if (links.cross_host.measured) cluster.cross_node = {links.cross_host.alpha_s, links.cross_host.beta_s_per_byte};

  nlohmann::json j = partition::cluster_to_json(cluster);
  j["measurements"] = {{"ranks", world->size()},
                       {"hosts", links.hosts},
                       {"point_to_point", {{"same_host", fit_json(links.same_host)}, {"cross_host", fit_json(links.cross_host)}}},
                       {"allreduce_ring_per_hop", fit_json(links.allreduce)}};
  std::ofstream file = open_output_file(out, std::ios::out, "--out file");
  file << j.dump(2) << "\n";
  close_output_file(file, out, "--out file");

  std::cout << fmt::format("probe: {} rank(s) on {} host(s); wrote {}\n", world->size(), links.n_hosts, out);
  std::cout << fmt::format("  {:<28} {:>13} {:>15}\n", "link class", "latency", "bandwidth");
  print_link("same host (point-to-point)", links.same_host, cluster.same_domain);
  print_link("cross host (point-to-point)", links.cross_host, cluster.cross_node);
  print_link("all-reduce, per ring hop", links.allreduce,
             partition::LinkCost{links.allreduce.alpha_s, links.allreduce.beta_s_per_byte});
  const auto& d = cluster.domain;
  std::cout << fmt::format(
      "  host: {} cores, {:.1f} GiB available, cache {:.0f} MiB (as streamed weights get it), kernel call {:.1f} us, "
      "step in a pass {:.2f} us, row work {:.2f} ns/element, attention {:.2f} us/head and {:.1f} GFLOP/s a core "
      "({} rows of a prompt at once), memory and compute overlap loss {:.2f}\n",
      d.cores, d.memory_bytes / (1 << 30), d.cache_bytes / (1 << 20), d.op_overhead_s * 1e6,
      std::max(0.0, d.step_overhead_s) * 1e6, d.row_element_s * 1e9, d.attention_head_s * 1e6,
      d.attention_flops / 1e9, d.attention_rows, d.overlap_loss);
  std::cout << fmt::format("  {:<6} {:>22} {:>22} {:>22} {:>20} {:>20}\n", "format", "GEMV 1 core (memory)",
                           "GEMV all (memory)", "GEMV 1 core (cache)", "GEMM 1 core, 64 rows", "16 rows");
  using partition::WeightFormat;
  for (const auto format : {WeightFormat::kF32, WeightFormat::kBf16, WeightFormat::kInt8}) {
    const partition::FormatRates r = d.rates(format);
    std::cout << fmt::format("  {:<6} {:>17.1f} GB/s {:>17.1f} GB/s {:>17.1f} GB/s {:>12.1f} GFLOP/s {:>12.1f} GFLOP/s\n",
                             partition::weight_format_name(format), r.core_bandwidth_bytes_per_s / 1e9,
                             r.domain_bandwidth_bytes_per_s / 1e9, r.cache_bandwidth_bytes_per_s / 1e9, r.core_flops / 1e9,
                             r.small_batch_rate() / 1e9);
  }
  return 0;
}

}  // namespace shardline::launch
