// libFuzzer target for sgpu's decoders of untrusted or half-written input. The first byte
// picks the decoder, the rest is its input; each must return or throw its own documented
// error, nothing else (no crash, no other exception, no undefined behaviour or read
// outside the input under AddressSanitizer and UndefinedBehaviorSanitizer):
//   0 record framing (call, result, worker-call and exception records)  RecordError
//   1 error records: rank-N/error.json and torchrun's error file        (never throws)
//   2 fault plans                                                       ConfigError
//   3 node specs                                                        ConfigError
//   4 timeouts as the command line gives them, message sizes            invalid_argument,
//                                                                       out_of_range
//   5 the checkpoint manifest                                           CheckpointError
//   6 the tracking spool                                                (never throws)
//   7 the collective model's platform files; what parses predicts a      ConfigError
//     finite time >= 0 and writes JSON that reads back the same
//   8 a pending run's record (tracking-pending.json)                    (never throws)
//   9 DeepSpeed configurations as ZeRO reads them                        ConfigError
//  10 what the nodes of a launch tell each other: a node's report         invalid_argument
//     (node_report.h), and Slurm host lists and rendezvous endpoints      ConfigError
//  11 safetensors files; what parses has tensors whose byte spans match   CheckpointError
//     the header
// Built and run by tests/fuzz/fuzz_decoders.sh with clang; seeds in tests/fuzz/corpus/.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>

#include "model/platform.h"
#include "nodes/nodes.h"
#include "serialize/error_record.h"
#include "serialize/node_report.h"
#include "serialize/record.h"
#include "sgpu/checkpoint/manifest.h"
#include "sgpu/checkpoint/safetensors.h"
#include "sgpu/errors.h"
#include "sgpu/options.h"
#include "sgpu/parallel/zero_config.h"
#include "sim/faults.h"
#include "sim/node_spec.h"
#include "tracking/pending.h"
#include "tracking/spool.h"

namespace {

// The input as a file, for the decoders that read one.
class InputFile {
 public:
  explicit InputFile(const std::string& bytes)
      : fd_(::memfd_create("sgpu-fuzz-input", MFD_CLOEXEC)) {
    if (fd_ < 0 || ::write(fd_, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) {
      std::abort();
    }
  }
  ~InputFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

void records(const std::string& bytes) {
  using sgpu::serialize::RecordKind;
  for (RecordKind kind :
       {RecordKind::kCall, RecordKind::kResult, RecordKind::kWorkerCall, RecordKind::kException}) {
    try {
      const std::string payload = sgpu::serialize::decode_record(bytes, kind, 1 << 16);
      // What decodes is one whole record: encoding its payload again gives the input, all
      // but the header's last 4 bytes (reserved: written 0, not read).
      std::string again = sgpu::serialize::encode_record(kind, payload);
      if (again.size() != bytes.size()) std::abort();
      std::copy_n(bytes.data() + 28, 4, again.data() + 28);
      if (again != bytes) std::abort();
    } catch (const sgpu::serialize::RecordError&) {
    }
  }
}

void platform(const std::string& text) {
  using sgpu::model::Collective;
  sgpu::model::Platform p;
  try {
    p = sgpu::model::parse_platform(text, "fuzz-input");
  } catch (const sgpu::ConfigError&) {
    return;
  }
  const sgpu::model::Platform again =
      sgpu::model::parse_platform(sgpu::model::platform_json(p), "again");
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kSendRecv}) {
    for (std::int64_t bytes :
         {std::int64_t{0}, std::int64_t{4}, std::int64_t{3} << 20, std::int64_t{1} << 34}) {
      const double seconds = sgpu::model::predict(p, c, bytes, 8).seconds;
      if (!std::isfinite(seconds) || seconds < 0) std::abort();
      if (sgpu::model::predict(again, c, bytes, 8).seconds != seconds) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 12) {
    case 0:
      records(input);
      break;
    case 1: {
      const InputFile file(input);
      (void)sgpu::serialize::read_error_record(file.path());
      (void)sgpu::serialize::read_torchelastic_error(file.path());
      break;
    }
    case 2:
      try {
        (void)sgpu::sim::parse_faults(input, 1 + static_cast<int>(size % 8));
      } catch (const sgpu::ConfigError&) {
      }
      break;
    case 3:
      try {
        (void)sgpu::sim::parse_node_spec(input);
      } catch (const sgpu::ConfigError&) {
      }
      break;
    case 4:
      try {
        (void)sgpu::parse_timeout(input);  // the options' checks judge its value
      } catch (const std::invalid_argument&) {
      } catch (const std::out_of_range&) {
      }
      try {
        if (sgpu::model::parse_message_size(input) < 0) std::abort();
      } catch (const std::invalid_argument&) {
      }
      break;
    case 5:
      try {
        (void)sgpu::checkpoint::Manifest::parse(input, "fuzz-input");
      } catch (const sgpu::checkpoint::CheckpointError&) {
      }
      break;
    case 6: {
      const InputFile file(input);
      (void)sgpu::tracking::read_spool(file.path());
      break;
    }
    case 7:
      platform(input);
      break;
    case 8: {
      const InputFile file(input);
      (void)sgpu::tracking::read_pending(file.path());
      break;
    }
    case 9:
      try {
        (void)sgpu::parallel::ZeroConfig::parse(input);
      } catch (const sgpu::ConfigError&) {
      }
      break;
    case 10:
      try {
        (void)sgpu::serialize::parse_node_report(input);
      } catch (const std::invalid_argument&) {
      }
      try {
        if (sgpu::nodes::expand_hostlist(input).empty() && !input.empty()) std::abort();
      } catch (const sgpu::ConfigError&) {
      }
      try {
        (void)sgpu::nodes::parse_endpoint(input, 29500, "fuzz");
      } catch (const sgpu::ConfigError&) {
      }
      break;
    case 11:
      try {
        using sgpu::checkpoint::Parsed;
        const Parsed parsed =
            sgpu::checkpoint::parse_buffer(std::span(data + 1, size - 1), "fuzz-input");
        for (const auto& entry : parsed.header.tensors) {
          if (parsed.tensors.at(entry.name).nbytes() != entry.end - entry.begin) std::abort();
        }
      } catch (const sgpu::checkpoint::CheckpointError&) {
      }
      break;
  }
  return 0;
}
