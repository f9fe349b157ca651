#include "rank/symbols.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace sgpu::rank {

std::shared_ptr<const SymbolTable> SymbolTable::load(const std::string& file) {
  auto table = std::make_shared<SymbolTable>();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return table;
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
    map = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  if (map == MAP_FAILED) return table;
  const auto* bytes = static_cast<const unsigned char*>(map);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const auto* header = reinterpret_cast<const ElfW(Ehdr)*>(bytes);
  const bool elf = std::memcmp(header->e_ident, ELFMAG, SELFMAG) == 0 &&
                   header->e_ident[EI_CLASS] == (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32) &&
                   header->e_shoff + std::uint64_t{header->e_shnum} * sizeof(ElfW(Shdr)) <= size;
  if (elf) {
    table->relocatable_ = header->e_type != ET_EXEC;
    const auto* sections = reinterpret_cast<const ElfW(Shdr)*>(bytes + header->e_shoff);
    for (int i = 0; i < header->e_shnum; ++i) {
      const ElfW(Shdr)& symtab = sections[i];
      if ((symtab.sh_type != SHT_SYMTAB && symtab.sh_type != SHT_DYNSYM) ||
          symtab.sh_link >= header->e_shnum) {
        continue;
      }
      const ElfW(Shdr)& strtab = sections[symtab.sh_link];
      if (symtab.sh_offset + symtab.sh_size > size || strtab.sh_offset + strtab.sh_size > size) {
        continue;
      }
      const auto* symbols = reinterpret_cast<const ElfW(Sym)*>(bytes + symtab.sh_offset);
      for (std::uint64_t k = 0; k < symtab.sh_size / sizeof(ElfW(Sym)); ++k) {
        const ElfW(Sym)& sym = symbols[k];
        if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 ||
            sym.st_name >= strtab.sh_size) {
          continue;
        }
        const char* text = reinterpret_cast<const char*>(bytes + strtab.sh_offset + sym.st_name);
        table->functions_.push_back(
            {sym.st_value, sym.st_size,
             std::string(text, strnlen(text, strtab.sh_size - sym.st_name))});
      }
    }
  }
  ::munmap(map, static_cast<std::size_t>(st.st_size));
  std::sort(table->functions_.begin(), table->functions_.end(),
            [](const Function& a, const Function& b) { return a.start < b.start; });
  return table;
}

std::string SymbolTable::name_at(std::uint64_t address) const {
  auto after = std::upper_bound(functions_.begin(), functions_.end(), address,
                                [](std::uint64_t a, const Function& f) { return a < f.start; });
  // Several symbols may start at one address (aliases) or nest: the nearest start whose
  // extent covers the address wins.
  while (after != functions_.begin()) {
    --after;
    if (address < after->start + std::max<std::uint64_t>(after->size, 1)) return after->name;
    if (after->start + (1 << 20) < address) break;  // no function is that long
  }
  return "";
}

std::string demangle(const std::string& symbol) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(
      abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && text ? text.get() : symbol;
}

}  // namespace sgpu::rank
