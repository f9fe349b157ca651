// The collective recorder (NOTE [The collective ring]): every process group sgpu hands out
// records what reaches its transport in the rank's ring, which the caller reads to say
// why a call hangs. The launcher sizes the ring (RankEnvironment::recorder_entries, from
// Options::recorder_entries; 0: nothing is recorded).
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/process_group_factory.h"
#include "contract/collective_ring.h"
#include "contract/run_folder.h"

namespace sgpu::model {
struct Platform;
}

namespace sgpu::collectives {

// The platform the rank's figures are predicted on (SGPU_PLATFORM, loaded once; the
// launcher checked that it loads before any rank started); nullptr for none.
const model::Platform* rank_platform();

// This rank's ring, created in its rank folder on first use; nullptr outside a rank, or
// when recording is off.
contract::CollectiveRing* rank_ring();

// In a process on a simulated node that sgpu did not start (NOTE [A node's worlds] in
// launcher/node_watch.h): a ring in `folder` for its place in a world it formed, kept to
// the process's end; nullptr when recording is off or the ring cannot be made (the world
// then runs unrecorded).
contract::CollectiveRing* world_ring(const contract::RankFolder& folder, int rank, int world_size);

// How an entry's end is learnt: from the Work's future (Gloo, shared memory: it completes
// with the collective), or by asking the Work until it says it is done (NCCL, whose
// future completes once the collective is enqueued on the stream).
enum class Completion { kFuture, kPolled };
// The way for a backend's groups ("cuda": polled).
Completion completion_for(const std::string& backend);

// At the rank's end, before its figures are read from the ring: the polled entries whose
// Works are done by then are ended (the poller looks only every few milliseconds), waiting
// up to `limit` for the rest; what is still running then stays in flight, as it was.
void settle_polled_entries(std::chrono::milliseconds limit);

// `transport` with every operation recorded in `ring` under `group`; `transport` itself
// when `ring` is null.
c10::intrusive_ptr<c10d::Backend> record_collectives(c10::intrusive_ptr<c10d::Backend> transport,
                                                     contract::CollectiveRing* ring,
                                                     const contract::RingGroup& group,
                                                     Completion completion);

// ProcessGroupRequest::record for a group: records into rank_ring().
backend::RecordHook recorder_for(contract::RingGroup group, Completion completion);

}  // namespace sgpu::collectives
