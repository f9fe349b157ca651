#include "rank/program.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "contract/rank_env.h"
#include "rank/symbols.h"
#include "sgpu/internal/call.h"

namespace sgpu::rank {
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

bool started_as_rank() { return started_as(contract::kRankRole); }

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
  if (dladdr(address, &info) != 0 && info.dli_sname != nullptr) return demangle(info.dli_sname);
  // The symbol table is read once per function: a sweep launches the same one many times.
  static std::mutex mutex;
  static std::map<const void*, std::string> names;
  std::lock_guard lock(mutex);
  if (const auto it = names.find(address); it != names.end()) return it->second;
  const serialize::CodeAddress where = locate_code(address);
  const std::string symbol =
      SymbolTable::load(where.module.empty() ? "/proc/self/exe" : where.module)
          ->name_at(where.offset);
  return names[address] = symbol.empty() ? "" : demangle(symbol);
}

std::string plain_name(const std::string& name) {
  // A lambda's function is named after where it is: "main::{lambda(int)#1}::_FUN(int)"
  // from GCC, "main::$_0::__invoke(int)" from Clang.
  auto lambda = name.find("{lambda");
  if (lambda == std::string::npos) {
    lambda = name.find("::$_");
    if (lambda != std::string::npos) lambda += 2;
  }
  if (lambda != std::string::npos) {
    std::string enclosing = name.substr(0, lambda);
    if (enclosing.size() >= 2 && enclosing.ends_with("::")) enclosing.resize(enclosing.size() - 2);
    enclosing = enclosing.empty() ? "" : plain_name(enclosing);
    return enclosing.empty() ? "lambda" : enclosing + " lambda";
  }
  std::string text = name;
  for (const std::string anonymous : {"(anonymous namespace)::", "{anonymous}::"}) {
    for (auto at = text.find(anonymous); at != std::string::npos; at = text.find(anonymous)) {
      text.erase(at, anonymous.size());
    }
  }
  // Drop the parameters, and template arguments, at any depth.
  std::string flat;
  int depth = 0;
  for (char c : text.substr(0, text.find('('))) {
    if (c == '<') ++depth;
    if (depth == 0) flat += c;
    if (c == '>' && depth > 0) --depth;
  }
  // A template instance's name starts with its return type: the last word is the name.
  const auto space = flat.find_last_of(' ');
  if (space != std::string::npos) flat = flat.substr(space + 1);
  const auto scope = flat.rfind("::");
  return scope == std::string::npos ? flat : flat.substr(scope + 2);
}

std::string program_run_name(const std::vector<std::string>& command) {
  if (command.empty()) return "";
  const auto base = [](const std::string& path) { return path.substr(path.find_last_of('/') + 1); };
  const std::string program = base(command.front());
  static const std::vector<std::string> interpreters = {"python", "bash", "sh",     "node",
                                                        "ruby",   "perl", "Rscript"};
  const bool interpreter = std::any_of(interpreters.begin(), interpreters.end(), [&](auto& i) {
    return program.rfind(i, 0) == 0 &&
           program.find_first_not_of("0123456789.", i.size()) == std::string::npos;
  });
  if (!interpreter) return program;
  for (std::size_t i = 1; i < command.size(); ++i) {
    if (command[i] == "-m" && i + 1 < command.size()) return command[i + 1];  // python -m pkg
    if (command[i] == "-c") break;                                            // inline code
    if (!command[i].empty() && command[i][0] != '-') return base(command[i]);
  }
  return program;
}

}  // namespace sgpu::rank
