#include "launcher/program.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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

// The name of the function whose code covers `offset` in the ELF file's own symbol table
// (.symtab), which holds what the dynamic one lacks: static functions and those in
// anonymous namespaces. "" when the file has none (stripped) or nothing covers it.
std::string symtab_name(const std::string& file, std::uint64_t offset) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
    map = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  if (map == MAP_FAILED) return "";
  const auto* bytes = static_cast<const unsigned char*>(map);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::string name;
  const auto* header = reinterpret_cast<const ElfW(Ehdr)*>(bytes);
  const bool elf = std::memcmp(header->e_ident, ELFMAG, SELFMAG) == 0 &&
                   header->e_ident[EI_CLASS] == (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32) &&
                   header->e_shoff + std::uint64_t{header->e_shnum} * sizeof(ElfW(Shdr)) <= size;
  const auto* sections =
      elf ? reinterpret_cast<const ElfW(Shdr)*>(bytes + header->e_shoff) : nullptr;
  for (int i = 0; elf && i < header->e_shnum && name.empty(); ++i) {
    const ElfW(Shdr)& symtab = sections[i];
    if (symtab.sh_type != SHT_SYMTAB || symtab.sh_link >= header->e_shnum) continue;
    const ElfW(Shdr)& strtab = sections[symtab.sh_link];
    if (symtab.sh_offset + symtab.sh_size > size || strtab.sh_offset + strtab.sh_size > size) break;
    const auto* symbols = reinterpret_cast<const ElfW(Sym)*>(bytes + symtab.sh_offset);
    for (std::uint64_t k = 0; k < symtab.sh_size / sizeof(ElfW(Sym)); ++k) {
      const ElfW(Sym)& sym = symbols[k];
      if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_name >= strtab.sh_size) continue;
      if (offset >= sym.st_value &&
          offset < sym.st_value + std::max<std::uint64_t>(sym.st_size, 1)) {
        const char* text = reinterpret_cast<const char*>(bytes + strtab.sh_offset + sym.st_name);
        name.assign(text, strnlen(text, strtab.sh_size - sym.st_name));
        break;
      }
    }
  }
  ::munmap(map, static_cast<std::size_t>(st.st_size));
  return name;
}

std::string demangled(const char* symbol) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(
      abi::__cxa_demangle(symbol, nullptr, nullptr, &status), std::free);
  return status == 0 && text ? text.get() : symbol;
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
  if (dladdr(address, &info) != 0 && info.dli_sname != nullptr) return demangled(info.dli_sname);
  // The symbol table is read once per function: a sweep launches the same one many times.
  static std::mutex mutex;
  static std::map<const void*, std::string> names;
  std::lock_guard lock(mutex);
  if (const auto it = names.find(address); it != names.end()) return it->second;
  const serialize::CodeAddress where = locate_code(address);
  const std::string symbol =
      symtab_name(where.module.empty() ? "/proc/self/exe" : where.module, where.offset);
  return names[address] = symbol.empty() ? "" : demangled(symbol.c_str());
}

std::string plain_name(const std::string& name) {
  // A lambda's function ("main::{lambda(int)#1}::_FUN(int)") is named after where it is.
  if (const auto lambda = name.find("{lambda"); lambda != std::string::npos) {
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

}  // namespace sgpu::launcher
