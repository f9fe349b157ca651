// libFuzzer target for the safetensors reader: any bytes either parse into tensors whose
// byte spans match the header, or raise CheckpointError; nothing else may happen (no
// crash, no other exception, no read outside the buffer under AddressSanitizer).
// Built and run by tests/checkpoint/fuzz_safetensors.sh with clang.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "sgpu/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sgpu::checkpoint;
  try {
    const Parsed parsed = parse_buffer(std::span(data, size), "fuzz-input");
    for (const auto& entry : parsed.header.tensors) {
      const at::Tensor& t = parsed.tensors.at(entry.name);
      if (t.nbytes() != entry.end - entry.begin) std::abort();
    }
  } catch (const CheckpointError&) {
  }
  return 0;
}
