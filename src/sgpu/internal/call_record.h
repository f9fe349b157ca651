// The staged call (call.bin): which function to run and with what.
//
// Functions travel by reference: caller and ranks run the same binary, so a function is
// named by its offset inside the loaded module that holds it (the main program, or a
// shared library named by path). `entry` is sgpu's typed trampoline for the function's
// signature; `signature` is checked by that trampoline before anything is called.
#pragma once

#include <cstdint>
#include <string>

namespace sgpu::serialize {

struct CodeAddress {
  std::string module;        // "" for the main program, else the shared library's path
  std::uint64_t offset = 0;  // from the module's load base

  template <class Archive>
  void serialize(Archive& ar) {
    ar(module, offset);
  }
};

struct CallRecord {
  CodeAddress entry;
  CodeAddress function;
  std::string signature;      // the mangled function type, checked in the rank
  std::string function_name;  // for messages
  std::string args;           // cereal bytes of the argument tuple
  std::uint64_t max_payload_bytes = 0;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(entry, function, signature, function_name, args, max_payload_bytes);
  }
};

}  // namespace sgpu::serialize
