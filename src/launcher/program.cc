#include "launcher/program.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "sgpu/internal/call.h"

namespace sgpu::launcher {
namespace {

std::vector<std::string>& args_storage() {
  static std::vector<std::string> args;
  return args;
}

struct ModuleQuery {
  std::uintptr_t address = 0;         // find the module holding this address, or
  const std::string* name = nullptr;  // the module with this name ("" = main program)
  bool found = false;
  bool is_main = false;
  std::string path;
  std::uintptr_t base = 0;
};

int visit_module(dl_phdr_info* info, std::size_t, void* data) {
  auto* query = static_cast<ModuleQuery*>(data);
  // The main program comes first and has an empty name.
  const bool is_main = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
  if (query->name != nullptr) {
    if ((query->name->empty() && is_main) ||
        (!query->name->empty() && !is_main && *query->name == info->dlpi_name)) {
      query->found = true;
      query->base = info->dlpi_addr;
      return 1;
    }
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD) continue;
    const std::uintptr_t start = info->dlpi_addr + segment.p_vaddr;
    if (query->address >= start && query->address < start + segment.p_memsz) {
      query->found = true;
      query->is_main = is_main;
      query->path = is_main ? "" : info->dlpi_name;
      query->base = info->dlpi_addr;
      return 1;
    }
  }
  return 0;
}

}  // namespace

void set_program_args(int argc, char** argv) {
  auto& args = args_storage();
  args.assign(argv, argv + argc);
}

const std::vector<std::string>& program_args() { return args_storage(); }

bool started_as(std::string_view role) {
  const char* value = std::getenv(contract::kRoleVar);
  return value != nullptr && role == value;
}

bool started_as_rank() { return started_as("rank"); }

serialize::CodeAddress locate_code(const void* address) {
  ModuleQuery query;
  query.address = reinterpret_cast<std::uintptr_t>(address);
  dl_iterate_phdr(visit_module, &query);
  if (!query.found) throw std::logic_error("sgpu: function address is in no loaded module");
  return serialize::CodeAddress{query.path, query.address - query.base};
}

void* resolve_code(const serialize::CodeAddress& address) {
  ModuleQuery query;
  query.name = &address.module;
  dl_iterate_phdr(visit_module, &query);
  if (!query.found) {
    throw std::runtime_error("sgpu: the rank's function lives in " + address.module +
                             ", which this rank process has not loaded");
  }
  return reinterpret_cast<void*>(query.base + address.offset);
}

std::string code_name(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_sname == nullptr) return "";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), std::free);
  return status == 0 && demangled ? demangled.get() : info.dli_sname;
}

}  // namespace sgpu::launcher
