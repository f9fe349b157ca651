#include "rank/rank_protocol.h"

#include <chrono>
#include <utility>

#include "contract/front_end.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "serialize/error_record.h"

namespace sgpu::rank {

std::string read_call(serialize::RecordKind kind) {
  return serialize::read_record_file(contract::read_rank_environment().call_file, kind,
                                     std::size_t{1} << 40);
}

void write_result(std::string_view result, std::size_t limit, FrontEnd front_end) {
  if (result.size() > limit) {
    throw serialize::RecordTooLarge(result.size(), limit, too_large_advice(front_end));
  }
  const contract::RankFolder folder{contract::read_rank_environment().rank_dir};
  serialize::write_record_file(folder.result(), serialize::RecordKind::kResult, result);
}

std::string too_large_advice(FrontEnd front_end) {
  return "raise " + contract::Spelling(front_end)("max_payload_bytes") + " or return less";
}

void write_error(RankError error) {
  const contract::RankEnvironment env = contract::read_rank_environment();
  const contract::RankFolder folder{env.rank_dir};
  if (error.exception) {
    serialize::write_record_file(folder.exception(), serialize::RecordKind::kException,
                                 *error.exception);
  }
  serialize::ErrorRecord record;
  record.type = std::move(error.type);
  record.message = std::move(error.message);
  record.rank = env.rank;
  record.time = std::chrono::system_clock::now();
  record.backtrace = std::move(error.traceback);
  serialize::write_error_record(folder.error(), record);
}

}  // namespace sgpu::rank
