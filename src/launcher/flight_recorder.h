// The ranks' collective rings as c10d flight-recorder dumps: one pickle a rank,
// <dir>/nccl_trace_rank_<N>, in the format torch 2.11's analyzer reads
// (`python -m torch.distributed.flight_recorder.fr_trace <dir>`), version "2.10". Each
// collective is an entry ("nccl:<op>" with the analyzer's op names, sizes as one flat
// tensor, dtypes by torch's names, "started" while in flight or failed, "completed" once
// done); every group any rank recorded is in every rank's pg_config. Transfers are left
// out: the analyzer matches them across the whole group, where only two ranks take part.
#pragma once

#include <filesystem>
#include <vector>

#include "contract/run_folder.h"
#include "launcher/hang_diagnosis.h"

namespace sgpu::launcher {

// Writes one dump per rank of `ranks` into `dir` (created). Throws std::runtime_error
// naming the file when one cannot be written.
void write_flight_recorder_dumps(const std::vector<RankView>& ranks,
                                 const std::filesystem::path& dir);

// The verdict for the ranks' rings now, written with their table to `folder`'s
// collectives.txt and as flight-recorder dumps into its flight-recorder/ (what cannot be
// written is left out: the verdict is returned all the same).
Diagnosis diagnose_into(const std::vector<RankView>& ranks, const contract::RunFolder& folder);
// Writes a verdict already reached for `ranks` to `folder` as diagnose_into does.
void write_diagnosis(const Diagnosis& d, const std::vector<RankView>& ranks,
                     const contract::RunFolder& folder);

}  // namespace sgpu::launcher
