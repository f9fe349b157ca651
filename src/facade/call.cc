// The seam between the public templates and the launcher (sgpu/internal/call.h), and the
// public helpers the launcher answers.
#include "sgpu/internal/call.h"

#include "contract/option_table.h"
#include "launcher/launcher.h"
#include "rank/program.h"
#include "sgpu/options.h"

namespace sgpu {

std::filesystem::path runs_dir_of(const Options& options) {
  return launcher::runs_dir(contract::with_environment(options));  // SGPU_RUNS_DIR
}

}  // namespace sgpu

namespace sgpu::detail {

std::shared_ptr<Call> start_call(const Options& options, serialize::CallRecord record) {
  return launcher::start_call(options, std::move(record));
}

std::shared_ptr<Call> start_program(const Options& options, std::vector<std::string> command) {
  return launcher::start_program(options, std::move(command));
}

serialize::CodeAddress locate_code(const void* address) { return rank::locate_code(address); }

std::string code_name(const void* address) { return rank::code_name(address); }

}  // namespace sgpu::detail
