#include "launch/field_agreement.h"

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "common/error.h"

namespace shardline::launch {

void require_same_fields(const MpiSession& mpi, double timeout_s, bool help,
                         const std::function<AgreedFields()>& list_fields, std::string_view fix) {
  if (mpi.world_size() == 1) return;
  AgreedFields mine{{"--help", given(help)}};
  std::exception_ptr failure;
  try {
    if (!help) {
      AgreedFields listed = list_fields();
      mine.insert(mine.end(), listed.begin(), listed.end());
    }
  } catch (...) {
    failure = std::current_exception();
  }
  const std::string rank0 = mpi.rank0_bytes(encode_fields(mine), timeout_s);
  std::optional<FieldDifference> difference;
  if (!failure) {
    try {
      difference = first_difference(mine, decode_fields(rank0));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Where every other rank of three or more differs from rank 0 in the same field with the same value, rank 0
  // is the one to fix.
  std::optional<std::uint64_t> what_differs;
  if (difference) what_differs = std::hash<std::string>{}(difference->name + '\0' + difference->mine);
  const MpiSession::Spread differing = mpi.spread(what_differs, timeout_s);
  if (failure) std::rethrow_exception(failure);
  if (difference) {
    const bool rank0_alone = mpi.world_size() >= 3 && differing.count == mpi.world_size() - 1 &&
                             differing.lowest == differing.highest;
    throw ConfigError(describe_difference(*difference, mpi.world_rank(), rank0_alone, fix));
  }
}

}  // namespace shardline::launch
