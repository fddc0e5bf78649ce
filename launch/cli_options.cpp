#include "launch/cli_options.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/did_you_mean.h"
#include "common/error.h"
#include "common/printable.h"
#include "kernels/cpu/isa.h"
#include "launch/mpi_session.h"

namespace shardline::launch {

namespace {

// text without the white space around it: values are read past it as the shell or a CRLF file left it.
std::string trimmed(const std::string& text) {
  constexpr const char* kSpace = " \t\r\n\v\f";
  const std::size_t first = text.find_first_not_of(kSpace);
  return first == std::string::npos ? std::string() : text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

bool is_number_flag(const po::option_description& flag) {
  const auto* semantic = flag.semantic().get();
  return dynamic_cast<const po::typed_value<int>*>(semantic) != nullptr ||
         dynamic_cast<const po::typed_value<float>*>(semantic) != nullptr ||
         dynamic_cast<const po::typed_value<double>*>(semantic) != nullptr;
}

}  // namespace

// What the options library, which calls every value it cannot take only "invalid", leaves unsaid: for a
// number flag, "; it does not fit ..." when the number is too large for it, else what kind of number it
// takes ("--steps 2.5", "--temperature abc"); "" for other flags.
std::string number_value_hint(const po::options_description& options, const po::invalid_option_value& e) {
  const po::option_description* flag = options.find_nothrow(flag_name(e.get_option_name()), /*approx=*/false);
  if (flag == nullptr || !is_number_flag(*flag)) return {};
  const bool is_int = dynamic_cast<const po::typed_value<int>*>(flag->semantic().get()) != nullptr;
  const bool is_float = dynamic_cast<const po::typed_value<float>*>(flag->semantic().get()) != nullptr;
  const std::string what = e.what();  // "the argument ('VALUE') for option '--flag' is invalid"
  // (An empty value, one of white space read past, is "the argument for option '--flag' is invalid".)
  const std::size_t open = what.find("('"), close = what.find("')");
  const std::string value = open == std::string::npos || close < open ? std::string()
                                                                      : what.substr(open + 2, close - open - 2);
  if (is_int) {
    const std::size_t digits = value.rfind('-', 0) == 0 ? 1 : 0;
    if (value.size() > digits && value.find_first_not_of("0123456789", digits) == std::string::npos) {
      return "; it does not fit a whole-number flag (-2147483648 to 2147483647)";
    }
    return "; it takes a whole number";
  }
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (is_float && !value.empty() && end == value.c_str() + value.size() && std::isfinite(number) &&
      std::abs(number) > std::numeric_limits<float>::max()) {
    return "; it is beyond a float's range (magnitudes up to 3.4e+38)";
  }
  return "; it takes a number";
}

po::parsed_options parse_flags(const std::vector<std::string>& args, const po::options_description& options) {
  po::parsed_options parsed = po::command_line_parser(args).options(options).style(kFlagStyle).run();
  // White space around a number is read past, as around the items of a list (parse_int_list): "--tp ' 2'"
  // was refused where "--tp ' 2, 4'" was not.
  for (po::option& option : parsed.options) {
    if (option.string_key.empty()) continue;  // a positional word (refused by the caller); "" matches every flag
    const po::option_description* flag = options.find_nothrow(option.string_key, /*approx=*/false);
    if (flag == nullptr || !is_number_flag(*flag)) continue;
    for (std::string& value : option.value) value = trimmed(value);
  }
  return parsed;
}

std::string flag_name(const std::string& word) {
  const std::size_t start = std::min(word.find_first_not_of('-'), word.size());
  const std::size_t equals = std::min(word.find('=', start), word.size());
  return word.substr(start, equals - start);
}

bool parse_command_line(const std::string& command, const std::string& usage, const po::options_description& options,
                        const std::vector<std::string>& args, po::variables_map& vm, bool print_help) {
  po::options_description all(options);
  all.add_options()("help,h", "show this help and exit");
  try {
    const po::parsed_options parsed = parse_flags(args, all);
    // A word without a flag would otherwise be dropped: `shardline run model.bin` ran the built-in model.
    for (const po::option& option : parsed.options) {
      if (option.string_key.empty() && !option.original_tokens.empty()) {
        throw ConfigError(fmt::format("shardline {}: unexpected argument '{}': every value follows its flag (e.g. "
                                      "--model FILE; see 'shardline {} --help')",
                                      command, option.original_tokens.front(), command));
      }
    }
    po::store(parsed, vm);
    if (vm.count("help")) {
      if (print_help) std::cout << usage << "\n\n" << all << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    throw ConfigError(fmt::format("shardline {}: unknown flag '{}'{} (see 'shardline {} --help')", command,
                                  e.get_option_name().substr(0, e.get_option_name().find('=')),
                                  did_you_mean(all, e.get_option_name()), command));
  } catch (const po::invalid_option_value& e) {
    throw ConfigError(fmt::format("shardline {}: {}{} (see 'shardline {} --help')", command, e.what(),
                                  number_value_hint(all, e), command));
  } catch (const po::error& e) {
    throw ConfigError(fmt::format("shardline {}: {} (see 'shardline {} --help')", command, e.what(), command));
  }
  return true;
}

std::string did_you_mean(const po::options_description& options, const std::string& unknown) {
  const std::string typed = flag_name(unknown);
  if (typed.size() < 3) return {};  // "-x", "--ab", "--=1": too short to guess from
  std::vector<std::string> names;
  for (const auto& option : options.options()) names.push_back(option->long_name());
  const std::string best = closest_name(typed, names);
  return best.empty() ? std::string() : fmt::format(" (did you mean '--{}'?)", best);
}

void check_rank_flag(const char* flag, int value) {
  if (value < 1 || value > kMaxRanksPerFlag) {
    throw ConfigError(fmt::format("{} {} is not a rank count from 1 to {}", flag, value, kMaxRanksPerFlag));
  }
}

void check_threads_flag(int value) {
  if (value < 1 || value > kMaxThreadsFlag) {
    throw ConfigError(fmt::format("--threads {} is not a thread count from 1 to {} (kernel threads per rank: about one "
                                  "per core it runs on)",
                                  value, kMaxThreadsFlag));
  }
}

void check_comm_timeout_flag(double timeout_s) {
  if (!(timeout_s >= kMinCommTimeoutS)) {
    throw ConfigError(fmt::format("--comm-timeout must be at least {:g} second (inf: no limit)", kMinCommTimeoutS));
  }
}

std::string rank_count_mismatch(int tp_flag, int pp_flag, int world) {
  const std::string ranks = fmt::format("the {} rank{} of this job", world, world == 1 ? "" : "s");
  if (tp_flag > 0 && pp_flag > 0) {
    return fmt::format("tp={} x pp={} does not match {}; launch {} ranks (mpirun -np {}, srun --ntasks={}) or change "
                       "--tp/--pp",
                       tp_flag, pp_flag, ranks, tp_flag * pp_flag, tp_flag * pp_flag, tp_flag * pp_flag);
  }
  const char* flag = tp_flag > 0 ? "--tp" : "--pp";
  const int given = std::max(tp_flag, pp_flag);
  return fmt::format("{} {} does not match {}: the ranks must be a multiple of it; launch a multiple of {} ranks "
                     "(mpirun -np, srun --ntasks) or change {}",
                     flag, given, ranks, given, flag);
}

std::uint64_t parse_seed_flag(const std::string& text) {
  // White space around it and a leading '+' as the number flags take them (--dim +5 was 5 while --seed +5
  // was refused).
  std::string digits = trimmed(text);
  if (digits.starts_with('+')) digits.erase(0, 1);
  errno = 0;  // digits only, so strtoull reads them all; ERANGE says they are past 2^64 - 1
  const unsigned long long value = std::strtoull(digits.c_str(), nullptr, 10);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE) {
    throw ConfigError(fmt::format("--seed '{}' is not a whole number from 0 to 18446744073709551615", text));
  }
  return value;
}

std::vector<int> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int> values;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    // White space around an item is read past on both sides ("2, 4" as typed, "2,4\r" from a CRLF file);
    // stoi alone skipped only the leading, so " 2" passed where "2 " was refused.
    const std::string item = trimmed(text.substr(at, comma - at));
    try {
      std::size_t used = 0;
      values.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::out_of_range&) {
      throw ConfigError(fmt::format("{} '{}': {} does not fit a whole number (-2147483648 to 2147483647)", flag,
                                    printable(text), printable(item)));
    } catch (const std::exception&) {
      throw ConfigError(fmt::format("{} expects comma-separated integers like 3,2,2; got '{}'", flag, printable(text)));
    }
    at = comma + 1;
  }
  return values;
}

kernels::cpu::WeightDtype parse_weights_dtype_flag(const std::string& text, const std::string& flag) {
  if (auto dtype = kernels::cpu::parse_weight_dtype(text)) return *dtype;
  throw ConfigError(fmt::format("unknown {} '{}' (use fp32, bf16 or int8)", flag, text));
}

std::optional<kernels::cpu::KvDtype> parse_kv_dtype_flag(const std::string& text) {
  if (text == "auto") return std::nullopt;
  if (auto dtype = kernels::cpu::parse_kv_dtype(text)) return *dtype;
  throw ConfigError(fmt::format("unknown --kv-dtype '{}' (use auto, fp32, fp16 or int8)", text));
}

void apply_isa_flag(const std::string& text) {
  if (text == "auto") return;
  const std::optional<kernels::cpu::Isa> isa = kernels::cpu::parse_isa(text);
  if (!isa) throw ConfigError(fmt::format("--isa must be auto, portable, avx2, avx512, avx512-vnni, avx512-bf16 or amx, got '{}'", text));
  if (*isa > kernels::cpu::best_isa()) {
    throw ResourceError(fmt::format("--isa {}: this CPU's best is {}", text, kernels::cpu::isa_name(kernels::cpu::best_isa())));
  }
  kernels::cpu::set_isa(*isa);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

int default_threads() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int local_ranks = local ? std::max(1, std::atoi(local)) : 1;
  const int cores = available_cores();
  const bool bound = cores < static_cast<int>(std::thread::hardware_concurrency());
  return bound ? cores : std::max(1, cores / local_ranks);
}

}  // namespace shardline::launch
