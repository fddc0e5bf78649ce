// Shared command-line plumbing: every subcommand parses with Boost.Program_options through here, so
// unknown flags, missing values and --help behave the same everywhere.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::launch {

namespace po = boost::program_options;

// The options library's default style, without guessing a flag from its prefix: `run --top 5` was taken
// as --top-p 5 (which turns nucleus sampling off), a slip waiting to happen next to plan's real --top.
inline constexpr int kFlagStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

// Parses args (argv after the subcommand) against options. Throws ConfigError naming the subcommand and
// the flag for unknown flags, bad values and positional arguments. Returns false when --help was asked
// (help printed to stdout when print_help; under mpirun only one rank prints it).
bool parse_command_line(const std::string& command, const std::string& usage, const po::options_description& options,
                        const std::vector<std::string>& args, po::variables_map& vm, bool print_help = true);

// args parsed against options in kFlagStyle, with white space around every number flag's value read past
// (as parse_int_list reads past it around a list's items). Throws the options library's errors.
po::parsed_options parse_flags(const std::vector<std::string>& args, const po::options_description& options);
// "; it takes a whole number" (or a number, or the range it missed) for a number flag's bad value, else "".
std::string number_value_hint(const po::options_description& options, const po::invalid_option_value& e);

// A flag's name as typed, without its dashes and any "=value": "--steps=3" -> "steps", "-n" -> "n".
std::string flag_name(const std::string& word);

// " (did you mean '--presets'?)" for an unknown flag close to one of options' long flags (a prefix of it, or
// at most two edits away: a typo or a singular), else "". unknown is as typed, e.g. "--preset".
std::string did_you_mean(const po::options_description& options, const std::string& unknown);

// The most ranks --tp or --pp may name: far past any model's heads or layers, and small enough that tp x pp
// fits an int (a product of two larger values wrapped around: launch-check said ok for 65536 x 65536 = 0).
inline constexpr int kMaxRanksPerFlag = 32768;
// ConfigError naming the flag unless 1 <= value <= kMaxRanksPerFlag.
void check_rank_flag(const char* flag, int value);

// The most kernel threads --threads may ask of one rank: several times the hardware threads of the largest
// hosts. Past it libgomp fails to create them (tens of thousands) or crashes (65536 segfaulted in
// GOMP_parallel).
inline constexpr int kMaxThreadsFlag = 1024;
// ConfigError unless 1 <= --threads <= kMaxThreadsFlag.
void check_threads_flag(int value);
// ConfigError unless --comm-timeout is at least kMinCommTimeoutS (inf: no limit; NaN is refused).
void check_comm_timeout_flag(double timeout_s);

// Why --tp/--pp (0 = not given) cannot lay out a job of `world` ranks, and what to launch instead.
std::string rank_count_mismatch(int tp_flag, int pp_flag, int world);

// --seed: a whole number from 0 to 2^64 - 1 (as text: the options library would wrap "-1" around to 2^64 - 1).
std::uint64_t parse_seed_flag(const std::string& text);

// "3,2,2" -> {3, 2, 2}; ConfigError naming the flag otherwise.
std::vector<int> parse_int_list(const std::string& flag, const std::string& text);

// "fp32" | "bf16" | "int8" -> the dtype; ConfigError naming --weights-dtype otherwise.
kernels::cpu::WeightDtype parse_weights_dtype_flag(const std::string& text, const std::string& flag = "--weights-dtype");
// --kv-dtype: "auto" -> nullopt (runtime::resolve_kv_dtype decides), "fp32" | "fp16" | "int8" -> the dtype;
// ConfigError naming the flag otherwise.
std::optional<kernels::cpu::KvDtype> parse_kv_dtype_flag(const std::string& text);
// What --kv-dtype's help says.
inline constexpr const char* kKvDtypeFlagHelp =
    "the KV cache's values: auto (fp32 with fp32 weights; fp16 with bf16 and int8 weights on AVX2 and AVX-512 "
    "CPUs; fp32 on CUDA)|fp32|fp16 (half the cache memory and attention traffic)|int8 (a quarter, plus a scale per head; "
    "CPU only, opt-in: it costs accuracy; see docs/kv-cache.md)";
// --isa: "auto" keeps the best kernels this CPU has; a named level (kernels/cpu/isa.h) steps down to it.
// ConfigError for an unknown name, ResourceError for a level this CPU lacks.
void apply_isa_flag(const std::string& text);
// What --isa's help says.
inline constexpr const char* kIsaFlagHelp =
    "kernel instruction set: auto (the best this CPU has; avx512-vnni where its avx512-bf16 dot products are slow) "
    "or portable|avx2|avx512|avx512-vnni|avx512-bf16|amx";

// Cores this process may run on (its affinity mask), for default thread counts.
int available_cores();

// Kernel threads of a rank when --threads is not given: a rank bound to a subset of the host's cores uses
// that subset; unbound ranks on one host share its cores (Open MPI says how many ranks the host runs).
int default_threads();

}  // namespace shardline::launch
