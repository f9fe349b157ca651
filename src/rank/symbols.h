// The functions of an ELF file by address: its own symbol table (.symtab: static
// functions and anonymous namespaces too) and its dynamic one, read once and searched by
// address. What names a rank's function in its run (program.h) and the frames of a hung
// rank's stacks (stacks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sgpu::rank {

class SymbolTable {
 public:
  // The file's functions; an empty table for a file that cannot be read or is no ELF.
  static std::shared_ptr<const SymbolTable> load(const std::string& file);

  // The raw (mangled) name of the function covering `address` (a virtual address of the
  // file, as its symbols give them); "" when none does.
  std::string name_at(std::uint64_t address) const;
  // True for a position-independent file (a shared object or PIE): its addresses are
  // offsets from where it is loaded.
  bool relocatable() const { return relocatable_; }

 private:
  struct Function {
    std::uint64_t start;
    std::uint64_t size;
    std::string name;
  };
  std::vector<Function> functions_;  // by start
  bool relocatable_ = true;
};

// The demangled name, or `symbol` itself when it is not a mangled C++ name.
std::string demangle(const std::string& symbol);

}  // namespace sgpu::rank
