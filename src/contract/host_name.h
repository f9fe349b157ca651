// This host's name, as gethostname gives it ("unknown" when it cannot): what a call's run
// records as its host and what a launch over several nodes names each node by.
#pragma once

#include <unistd.h>

#include <string>

namespace sgpu::contract {

inline std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace sgpu::contract
