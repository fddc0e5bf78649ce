// What every rank of a job must share (the model, the requests, the layout flags), field by field: rank 0's
// fields go to every rank, and a rank that differs is told which field and both values, where one
// fingerprint of them all could only say that something differed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardline::launch {

struct AgreedField {
  std::string name;   // as the user knows it: a flag ("--kv-dtype") or what a file gives ("model shape")
  std::string value;  // short: a flag's value, a digest, or comparable_value() of user text
};
using AgreedFields = std::vector<AgreedField>;

// A switch's value: "given" or "not given"; a count whose 0 means the flag was left out: the count or "not given".
std::string given(bool yes);
std::string count_or_not_given(int count);

// A value as fields hold it: short text as it is; longer text (a prompt) as its start and a digest of the
// whole, so that what rank 0 sends every rank stays small and a message can still show it.
std::string comparable_value(std::string_view text);

// Fields as bytes (lengths before contents: values may hold any byte) and back; decode throws ConfigError on
// bytes no encode_fields wrote (another build's).
std::string encode_fields(const AgreedFields& fields);
AgreedFields decode_fields(std::string_view bytes);

struct FieldDifference {
  std::string name;
  std::string mine;   // "(none)" where this rank has fewer fields
  std::string rank0;  // "(none)" where rank 0 has fewer
};
// The first field, in order, whose name or value differs from rank 0's; nullopt when all agree, and when
// rank 0 has none (it failed to list them: every list starts with --help).
std::optional<FieldDifference> first_difference(const AgreedFields& mine, const AgreedFields& rank0);

// The error line for a rank that differs, ending in `fix` (what to give every rank). rank0_alone: every
// other rank of a job of three or more differs from rank 0 the same way, so rank 0 is the one to fix.
std::string describe_difference(const FieldDifference& difference, int rank, bool rank0_alone, std::string_view fix);

}  // namespace shardline::launch
