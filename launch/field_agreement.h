// The start-up check that every rank of a job was given what it must share (the model, the requests, the
// layout and measurement flags): an MPMD launch, or a host with another copy of a file, that gave ranks
// different ones would otherwise wait in its first collective until --comm-timeout, or compute with
// mismatched sizes. Rank 0's fields go to every rank (launch/agreed_fields.h).
#pragma once

#include <functional>
#include <string_view>

#include "launch/agreed_fields.h"
#include "launch/mpi_session.h"

namespace shardline::launch {

// Collective, called by every rank inside an agreed_phase: lists this rank's fields, compares them with rank
// 0's and throws ConfigError naming the first that differs, with both values. --help comes first, and a rank
// given it lists nothing else (it has parsed nothing else); the others list theirs with list_fields. Every
// rank reaches every collective whatever listing or comparing its own fields did (an exception there is
// rethrown after them). Alone, a rank has nobody to differ from: nothing is listed.
// fix: what the error line asks for ("give every rank the same ...").
void require_same_fields(const MpiSession& mpi, double timeout_s, bool help,
                         const std::function<AgreedFields()>& list_fields, std::string_view fix);

}  // namespace shardline::launch
