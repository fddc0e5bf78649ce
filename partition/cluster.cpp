#include "partition/cluster.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/did_you_mean.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/printable.h"

namespace shardline::partition {

const char* link_class_name(LinkClass link) {
  switch (link) {
    case LinkClass::kSameDomain: return "same_domain";
    case LinkClass::kCrossDomain: return "cross_domain";
    case LinkClass::kCrossNode: return "cross_node";
  }
  return "?";
}

const char* device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32: return "fp32";
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kInt8: return "int8";
  }
  return "?";
}

FormatRates DomainSpec::rates(WeightFormat format) const {
  const FormatRates fp32{core_bandwidth_bytes_per_s, domain_bandwidth_bytes_per_s, cache_bandwidth_bytes_per_s,
                         core_flops, small_batch_flops, row_element_s};
  if (format == WeightFormat::kF32) return fp32;
  const FormatRates& own = format == WeightFormat::kBf16 ? bf16 : int8;
  auto pick = [](double mine, double fallback) { return mine > 0 ? mine : fallback; };
  return {pick(own.core_bandwidth_bytes_per_s, fp32.core_bandwidth_bytes_per_s),
          pick(own.domain_bandwidth_bytes_per_s, fp32.domain_bandwidth_bytes_per_s),
          pick(own.cache_bandwidth_bytes_per_s, fp32.cache_bandwidth_bytes_per_s),
          pick(own.core_flops, fp32.core_flops),
          // A format whose GEMM rate is given but not its 16-row one runs small batches at that rate.
          own.core_flops > 0 ? own.small_batch_flops : fp32.small_batch_flops,
          pick(own.row_element_s, fp32.row_element_s)};
}

void DomainSpec::set_rates(WeightFormat format, const FormatRates& r) {
  if (format == WeightFormat::kBf16) {
    bf16 = r;
  } else if (format == WeightFormat::kInt8) {
    int8 = r;
  } else {
    core_bandwidth_bytes_per_s = r.core_bandwidth_bytes_per_s;
    domain_bandwidth_bytes_per_s = r.domain_bandwidth_bytes_per_s;
    cache_bandwidth_bytes_per_s = r.cache_bandwidth_bytes_per_s;
    core_flops = r.core_flops;
    small_batch_flops = r.small_batch_flops;
    row_element_s = r.row_element_s;
  }
}

LinkClass ClusterSpec::link_between(int rank_a, int rank_b) const {
  if (domain_of(rank_a) == domain_of(rank_b)) return LinkClass::kSameDomain;
  if (node_of(rank_a) == node_of(rank_b)) return LinkClass::kCrossDomain;
  return LinkClass::kCrossNode;
}

const LinkCost& ClusterSpec::link(LinkClass link) const {
  switch (link) {
    case LinkClass::kSameDomain: return same_domain;
    case LinkClass::kCrossDomain: return cross_domain;
    case LinkClass::kCrossNode: return cross_node;
  }
  return cross_node;
}

namespace {

// The range a field's unit allows (its name ends in the unit), so that no value turns the cost model's
// numbers into Inf, NaN or hundreds of digits: a core_flops of 5e-324 printed TTFT -nan us, 1e-300 printed
// 300-digit times. Rates are at least one per second, times at most an hour (a link, an op), sizes at
// most an exabyte; all far outside any machine's.
struct UnitRange {
  double lowest, highest;
  const char* unit;
};
UnitRange unit_range(std::string_view key) {
  if (key.ends_with("_bytes_per_s") || key.ends_with("_flops")) return {1, 1e21, "per second"};
  if (key.ends_with("_gbps")) return {1e-9, 1e12, "Gbit/s"};
  if (key.ends_with("_s_per_byte")) return {1e-21, 1, "seconds per byte"};
  if (key.ends_with("_s")) return {1e-12, 3600, "seconds"};
  if (key.ends_with("_bytes")) return {1, 1e18, "bytes"};
  return {0, 1e21, ""};  // counts and fractions have their own, narrower checks
}

// ConfigError unless j is an object whose keys are all known (or notes: keys that start with '_'). A typo in
// an optional key would otherwise leave its default in place and plan for another cluster than the file's.
void check_keys(const nlohmann::json& j, const std::string& where, std::initializer_list<std::string_view> known) {
  if (!j.is_object()) throw ConfigError(fmt::format("cluster file: {} must be a JSON object", where));
  for (const auto& [key, value] : j.items()) {
    if (key.starts_with('_') || std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string guess = closest_name(key, known);
    throw ConfigError(fmt::format("cluster file: {} has an unknown key \"{}\"{}", where, printable(key, 64),
                                  guess.empty() ? "; notes go in keys that start with '_'"
                                                : fmt::format("; did you mean \"{}\"?", guess)));
  }
}

// The number at key, or ConfigError when it is missing or not a number.
double number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw ConfigError(fmt::format("cluster file: {} lacks \"{}\"", where, key));
  if (!j[key].is_number()) throw ConfigError(fmt::format("cluster file: {}.{} must be a number", where, key));
  return j[key].get<double>();
}

double positive(const nlohmann::json& j, const char* key, const std::string& where, bool allow_zero = false) {
  const double value = number(j, key, where);
  if (value < 0 || (!allow_zero && value == 0)) {
    throw ConfigError(fmt::format("cluster file: {}.{} must be {}, got {}", where, key,
                                  allow_zero ? ">= 0" : "> 0", value));
  }
  const UnitRange range = unit_range(key);
  if (value != 0 && (value < range.lowest || value > range.highest)) {
    throw ConfigError(fmt::format("cluster file: {}.{} must be {}from {:g} to {:g}{}{}, got {:g}", where, key,
                                  allow_zero ? "0 or " : "", range.lowest, range.highest, *range.unit ? " " : "",
                                  range.unit, value));
  }
  return value;
}

// An optional field: where j has it, a number >= 0 into field; else field keeps its default.
void read_optional(const nlohmann::json& j, const char* key, const std::string& where, double& field) {
  if (j.contains(key)) field = positive(j, key, where, true);
}

// A count (nodes, domains, slots, cores): a whole number from 1 to kMaxCount, so that products of counts
// (a cluster's rank slots) stay far inside an int.
constexpr double kMaxCount = 1 << 20;
int count(const nlohmann::json& j, const char* key, const std::string& where) {
  // Its own range first (positive()'s generic one named 1e+21 for a count); no cast before it (1e308 to an
  // integer is undefined).
  const double value = number(j, key, where);
  if (!(value >= 1 && value <= kMaxCount) || value != std::floor(value)) {
    throw ConfigError(fmt::format("cluster file: {}.{} must be a whole number from 1 to {}, got {}", where, key,
                                  static_cast<long long>(kMaxCount), value));
  }
  return static_cast<int>(value);
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag, which says nothing to a user.
std::string json_reason(const nlohmann::json::exception& e) {
  const std::string_view text = e.what();
  const std::size_t tag_end = text.find("] ");
  // printable: the parser quotes what it last read, which in a binary file is any bytes at all.
  return printable(text.starts_with("[json.exception.") && tag_end != std::string_view::npos ? text.substr(tag_end + 2)
                                                                                             : text, 400);
}

LinkCost link_from_json(const nlohmann::json& links, const char* name) {
  if (!links.contains(name)) throw ConfigError(fmt::format("cluster file: links lacks \"{}\"", name));
  const auto& j = links[name];
  const std::string where = fmt::format("links.{}", name);
  check_keys(j, where, {"alpha_s", "bandwidth_gbps", "bandwidth_bytes_per_s", "beta_s_per_byte"});
  LinkCost link;
  link.alpha_s = positive(j, "alpha_s", where, true);
  // Bandwidth is friendlier to write than β; any of the three may be given, and several (as cluster_to_json
  // writes β and bandwidth_bytes_per_s) only when they agree.
  std::vector<std::pair<const char*, double>> given;  // (key, seconds per byte)
  if (j.contains("bandwidth_gbps")) given.emplace_back("bandwidth_gbps", 1.0 / (positive(j, "bandwidth_gbps", where) * 1e9 / 8.0));
  if (j.contains("bandwidth_bytes_per_s")) {
    given.emplace_back("bandwidth_bytes_per_s", 1.0 / positive(j, "bandwidth_bytes_per_s", where));
  }
  if (j.contains("beta_s_per_byte")) given.emplace_back("beta_s_per_byte", positive(j, "beta_s_per_byte", where));
  if (given.empty()) {
    throw ConfigError(fmt::format("cluster file: {} lacks a bandwidth: give \"bandwidth_gbps\", "
                                  "\"bandwidth_bytes_per_s\" or \"beta_s_per_byte\"", where));
  }
  for (const auto& [key, beta] : given) {
    if (std::abs(beta - given[0].second) > 1e-6 * given[0].second) {
      throw ConfigError(fmt::format("cluster file: {}.{} and {}.{} give different bandwidths ({:.4g} and {:.4g} "
                                    "bytes/s); keep one", where, given[0].first, where, key, 1.0 / given[0].second,
                                    1.0 / beta));
    }
  }
  link.beta_s_per_byte = given[0].second;
  return link;
}

// domain.formats.<name>: every field optional (0 or absent = fp32's), none negative.
FormatRates format_rates_from_json(const nlohmann::json& formats, WeightFormat format) {
  const char* name = weight_format_name(format);
  FormatRates r;
  if (!formats.contains(name)) return r;
  const auto& j = formats[name];
  const std::string where = fmt::format("domain.formats.{}", name);
  check_keys(j, where, {"core_bandwidth_bytes_per_s", "domain_bandwidth_bytes_per_s", "cache_bandwidth_bytes_per_s",
                        "core_flops", "small_batch_flops", "row_element_s"});
  read_optional(j, "core_bandwidth_bytes_per_s", where, r.core_bandwidth_bytes_per_s);
  read_optional(j, "domain_bandwidth_bytes_per_s", where, r.domain_bandwidth_bytes_per_s);
  read_optional(j, "cache_bandwidth_bytes_per_s", where, r.cache_bandwidth_bytes_per_s);
  read_optional(j, "core_flops", where, r.core_flops);
  read_optional(j, "small_batch_flops", where, r.small_batch_flops);
  read_optional(j, "row_element_s", where, r.row_element_s);
  return r;
}

nlohmann::json format_rates_to_json(const FormatRates& r) {
  return {{"core_bandwidth_bytes_per_s", r.core_bandwidth_bytes_per_s},
          {"domain_bandwidth_bytes_per_s", r.domain_bandwidth_bytes_per_s},
          {"cache_bandwidth_bytes_per_s", r.cache_bandwidth_bytes_per_s},
          {"core_flops", r.core_flops},
          {"small_batch_flops", r.small_batch_flops},
          {"row_element_s", r.row_element_s}};
}

nlohmann::json link_to_json(const LinkCost& link) {
  return {{"alpha_s", link.alpha_s}, {"beta_s_per_byte", link.beta_s_per_byte},
          {"bandwidth_bytes_per_s", link.bandwidth_bytes_per_s()}};
}

}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("cluster file: the top level must be a JSON object");
  // measurements: what probe measured, kept for the reader.
  check_keys(j, "cluster",
             {"name", "device", "nodes", "domains_per_node", "ranks_per_domain", "domain", "links", "measurements"});
  ClusterSpec c;
  if (j.contains("name") && !j["name"].is_string()) throw ConfigError("cluster file: cluster.name must be a string");
  c.name = j.value("name", "cluster");
  if (j.contains("device")) {
    const auto& device = j["device"];
    if (device == "cpu") {
      c.device = Device::kCpu;
    } else if (device == "cuda") {
      c.device = Device::kCuda;
    } else {
      throw ConfigError(fmt::format("cluster file: cluster.device must be \"cpu\" or \"cuda\" (a GPU per domain), got {}",
                                    printable(device.dump(), 64)));
    }
  }
  c.nodes = count(j, "nodes", "cluster");
  c.domains_per_node = count(j, "domains_per_node", "cluster");
  c.ranks_per_domain = j.contains("ranks_per_domain") ? count(j, "ranks_per_domain", "cluster") : 1;
  if (static_cast<double>(c.nodes) * c.domains_per_node * c.ranks_per_domain > kMaxCount) {
    throw ConfigError(fmt::format("cluster file: {} nodes x {} domains x {} ranks per domain is over {} rank slots",
                                  c.nodes, c.domains_per_node, c.ranks_per_domain, static_cast<long long>(kMaxCount)));
  }
  if (!j.contains("domain")) throw ConfigError("cluster file: lacks \"domain\"");
  const auto& d = j["domain"];
  check_keys(d, "domain", {"cores", "memory_bytes", "core_bandwidth_bytes_per_s", "domain_bandwidth_bytes_per_s",
                           "core_flops", "cache_bytes", "cache_bandwidth_bytes_per_s", "op_overhead_s",
                           "step_overhead_s", "small_batch_flops", "row_element_s", "attention_head_s",
                           "attention_rows", "attention_flops", "overlap_loss", "formats"});
  c.domain.cores = count(d, "cores", "domain");
  c.domain.memory_bytes = positive(d, "memory_bytes", "domain");
  c.domain.core_bandwidth_bytes_per_s = positive(d, "core_bandwidth_bytes_per_s", "domain");
  c.domain.domain_bandwidth_bytes_per_s = positive(d, "domain_bandwidth_bytes_per_s", "domain");
  c.domain.core_flops = positive(d, "core_flops", "domain");
  read_optional(d, "cache_bytes", "domain", c.domain.cache_bytes);
  read_optional(d, "cache_bandwidth_bytes_per_s", "domain", c.domain.cache_bandwidth_bytes_per_s);
  read_optional(d, "op_overhead_s", "domain", c.domain.op_overhead_s);
  read_optional(d, "step_overhead_s", "domain", c.domain.step_overhead_s);
  read_optional(d, "small_batch_flops", "domain", c.domain.small_batch_flops);
  read_optional(d, "row_element_s", "domain", c.domain.row_element_s);
  read_optional(d, "attention_head_s", "domain", c.domain.attention_head_s);
  if (d.contains("attention_rows")) c.domain.attention_rows = count(d, "attention_rows", "domain");
  read_optional(d, "attention_flops", "domain", c.domain.attention_flops);
  if (d.contains("overlap_loss")) {  // a fraction: its own range (positive()'s generic one said up to 1e+21)
    c.domain.overlap_loss = number(d, "overlap_loss", "domain");
    if (!(c.domain.overlap_loss >= 0 && c.domain.overlap_loss <= 1)) {
      throw ConfigError(
          fmt::format("cluster file: domain.overlap_loss must be from 0 to 1, got {:g}", c.domain.overlap_loss));
    }
  }
  if (d.contains("formats")) {
    const auto& formats = d["formats"];
    if (!formats.is_object()) throw ConfigError("cluster file: domain.formats must be a JSON object");
    for (const auto& [name, value] : formats.items()) {
      if (name != "bf16" && name != "int8") {
        throw ConfigError(fmt::format("cluster file: domain.formats.{} is not a weight format (bf16 or int8; fp32 is "
                                      "the domain's own fields)", name));
      }
    }
    c.domain.bf16 = format_rates_from_json(formats, WeightFormat::kBf16);
    c.domain.int8 = format_rates_from_json(formats, WeightFormat::kInt8);
  }
  if (!j.contains("links")) throw ConfigError("cluster file: lacks \"links\"");
  check_keys(j["links"], "links", {"same_domain", "cross_domain", "cross_node"});
  c.same_domain = link_from_json(j["links"], "same_domain");
  c.cross_domain = link_from_json(j["links"], "cross_domain");
  c.cross_node = link_from_json(j["links"], "cross_node");
  return c;
}

nlohmann::json cluster_to_json(const ClusterSpec& c) {
  nlohmann::json j = {{"name", c.name},
          {"device", device_name(c.device)},
          {"nodes", c.nodes},
          {"domains_per_node", c.domains_per_node},
          {"ranks_per_domain", c.ranks_per_domain},
          {"domain",
           {{"cores", c.domain.cores},
            {"memory_bytes", c.domain.memory_bytes},
            {"core_bandwidth_bytes_per_s", c.domain.core_bandwidth_bytes_per_s},
            {"domain_bandwidth_bytes_per_s", c.domain.domain_bandwidth_bytes_per_s},
            {"core_flops", c.domain.core_flops},
            {"cache_bytes", c.domain.cache_bytes},
            {"cache_bandwidth_bytes_per_s", c.domain.cache_bandwidth_bytes_per_s},
            {"op_overhead_s", c.domain.op_overhead_s}}},
          {"links",
           {{"same_domain", link_to_json(c.same_domain)},
            {"cross_domain", link_to_json(c.cross_domain)},
            {"cross_node", link_to_json(c.cross_node)}}}};
  if (c.domain.step_overhead_s >= 0) j["domain"]["step_overhead_s"] = c.domain.step_overhead_s;
  j["domain"]["small_batch_flops"] = c.domain.small_batch_flops;
  j["domain"]["row_element_s"] = c.domain.row_element_s;
  j["domain"]["attention_head_s"] = c.domain.attention_head_s;
  j["domain"]["attention_rows"] = c.domain.attention_rows;
  j["domain"]["attention_flops"] = c.domain.attention_flops;
  j["domain"]["overlap_loss"] = c.domain.overlap_loss;
  j["domain"]["formats"] = {{"bf16", format_rates_to_json(c.domain.bf16)},
                            {"int8", format_rates_to_json(c.domain.int8)}};
  return j;
}

ClusterSpec load_cluster_file(const std::string& path) {
  const std::string text = read_text_input(path, "cluster file", kPipedTextTimeoutS, kMaxTextInputBytes);
  // nlohmann stops at a NUL byte as at the end of the input, and keeps the last of a key given twice in one
  // object: both let a damaged or hand-merged file through silently, the second with a value nobody meant.
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    throw FormatError(fmt::format("cluster file '{}' holds a NUL byte at offset {}: it is not a text file, or was "
                                  "damaged; write it again (shardline probe --out, or an editor)",
                                  path, nul));
  }
  std::vector<std::vector<std::string>> keys;  // each open object's keys so far
  std::string twice;
  const nlohmann::json::parser_callback_t note_keys = [&](int, nlohmann::json::parse_event_t event,
                                                          nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys.emplace_back();
    if (event == Event::object_end && !keys.empty()) keys.pop_back();
    if (event == Event::key && !keys.empty() && twice.empty()) {
      const std::string key = parsed.get<std::string>();
      std::vector<std::string>& seen = keys.back();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) twice = key;
      seen.push_back(key);
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers beyond a double (1e999)
    throw FormatError(fmt::format("cluster file '{}' is not valid JSON: {}", path, json_reason(e)));
  }
  if (!twice.empty()) {
    throw FormatError(fmt::format("cluster file '{}' gives the key '{}' twice in one object; keep the one you mean",
                                  path, printable(twice)));
  }
  try {
    return cluster_from_json(j);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{} ({})", e.what(), path));
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
    throw FormatError(fmt::format("cluster file '{}': {}", path, json_reason(e)));
  }
}

}  // namespace shardline::partition
