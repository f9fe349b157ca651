#include "rendezvous/peer_names.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace sgpu::rendezvous {

namespace {

int mapped_as_ipv4(const sockaddr* address, socklen_t length, char* host, socklen_t host_length,
                   char* service, socklen_t service_length, int flags) {
  if (address != nullptr && address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      sockaddr_in v4{};
      v4.sin_family = AF_INET;
      v4.sin_port = v6->sin6_port;
      std::memcpy(&v4.sin_addr, &v6->sin6_addr.s6_addr[12], sizeof v4.sin_addr);
      return ::getnameinfo(reinterpret_cast<const sockaddr*>(&v4), sizeof v4, host, host_length,
                           service, service_length, flags);
    }
  }
  return ::getnameinfo(address, length, host, host_length, service, service_length, flags);
}

#if defined(__x86_64__)
constexpr std::uint32_t kJumpSlot = R_X86_64_JUMP_SLOT;
constexpr std::uint32_t kGlobalData = R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
constexpr std::uint32_t kJumpSlot = R_AARCH64_JUMP_SLOT;
constexpr std::uint32_t kGlobalData = R_AARCH64_GLOB_DAT;
#else
#error "sgpu: name the relocation types of this architecture's function slots"
#endif

bool is_libtorch(const char* path) {
  const std::string_view name(path == nullptr ? "" : path);
  const std::string_view file = name.substr(name.rfind('/') + 1);
  return file.substr(0, 8) == "libtorch";
}

// glibc leaves the dynamic section's addresses relocated; other loaders leave offsets.
template <typename T>
T* at(const dl_phdr_info* object, ElfW(Addr) value) {
  return reinterpret_cast<T*>(value < object->dlpi_addr ? value + object->dlpi_addr : value);
}

struct Object {
  const dl_phdr_info* info;
  const ElfW(Sym) * symbols;
  const char* names;
  std::uintptr_t relro_begin = 0, relro_end = 0;  // read-only once the loader is done
};

// Points `slot` at the mapped lookup, lifting the object's RELRO protection for the write
// and putting it back.
bool rewrite(const Object& object, void** slot) {
  const auto where = reinterpret_cast<std::uintptr_t>(slot);
  if (where < object.relro_begin || where >= object.relro_end) {
    *slot = reinterpret_cast<void*>(&mapped_as_ipv4);
    return true;
  }
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto* first = reinterpret_cast<void*>(where & ~(page - 1));
  if (::mprotect(first, page, PROT_READ | PROT_WRITE) != 0) return false;
  *slot = reinterpret_cast<void*>(&mapped_as_ipv4);
  ::mprotect(first, page, PROT_READ);
  return true;
}

int rewrite_slots(const Object& object, const ElfW(Rela) * relocations, std::size_t bytes) {
  int rewritten = 0;
  for (std::size_t i = 0; i < bytes / sizeof(ElfW(Rela)); ++i) {
    const ElfW(Rela)& relocation = relocations[i];
    const auto type = static_cast<std::uint32_t>(ELF64_R_TYPE(relocation.r_info));
    if (type != kJumpSlot && type != kGlobalData) continue;
    const ElfW(Sym)& symbol = object.symbols[ELF64_R_SYM(relocation.r_info)];
    if (std::strcmp(object.names + symbol.st_name, "getnameinfo") != 0) continue;
    auto* slot = reinterpret_cast<void**>(object.info->dlpi_addr + relocation.r_offset);
    if (*slot == reinterpret_cast<void*>(&mapped_as_ipv4) || rewrite(object, slot)) ++rewritten;
  }
  return rewritten;
}

// The libtorch objects already rewritten, by load address and path, with their slot counts:
// a later call scans only what was loaded since.
using Rewritten = std::map<std::pair<ElfW(Addr), std::string>, int>;

int rewrite_object(dl_phdr_info* object, std::size_t, void* done) {
  if (!is_libtorch(object->dlpi_name)) return 0;
  auto& rewritten_objects = *static_cast<Rewritten*>(done);
  const auto [known, fresh] =
      rewritten_objects.try_emplace({object->dlpi_addr, std::string(object->dlpi_name)}, 0);
  if (!fresh) return 0;
  Object found{object, nullptr, nullptr};
  const ElfW(Dyn)* dynamic = nullptr;
  for (int i = 0; i < object->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = object->dlpi_phdr[i];
    if (segment.p_type == PT_DYNAMIC) {
      dynamic = reinterpret_cast<const ElfW(Dyn)*>(object->dlpi_addr + segment.p_vaddr);
    } else if (segment.p_type == PT_GNU_RELRO) {
      found.relro_begin = object->dlpi_addr + segment.p_vaddr;
      found.relro_end = found.relro_begin + segment.p_memsz;
    }
  }
  if (dynamic == nullptr) return 0;
  ElfW(Addr) symbols = 0, names = 0, plt = 0, rela = 0;
  std::size_t plt_bytes = 0, rela_bytes = 0;
  bool plt_is_rela = true;
  for (const ElfW(Dyn)* entry = dynamic; entry->d_tag != DT_NULL; ++entry) {
    switch (entry->d_tag) {
      case DT_SYMTAB:
        symbols = entry->d_un.d_ptr;
        break;
      case DT_STRTAB:
        names = entry->d_un.d_ptr;
        break;
      case DT_JMPREL:
        plt = entry->d_un.d_ptr;
        break;
      case DT_PLTRELSZ:
        plt_bytes = entry->d_un.d_val;
        break;
      case DT_PLTREL:
        plt_is_rela = entry->d_un.d_val == DT_RELA;
        break;
      case DT_RELA:
        rela = entry->d_un.d_ptr;
        break;
      case DT_RELASZ:
        rela_bytes = entry->d_un.d_val;
        break;
      default:
        break;
    }
  }
  if (symbols == 0 || names == 0) return 0;
  found.symbols = at<const ElfW(Sym)>(object, symbols);
  found.names = at<const char>(object, names);
  int& rewritten = known->second;
  if (plt != 0 && plt_is_rela) {
    rewritten += rewrite_slots(found, at<const ElfW(Rela)>(object, plt), plt_bytes);
  }
  if (rela != 0) rewritten += rewrite_slots(found, at<const ElfW(Rela)>(object, rela), rela_bytes);
  return 0;
}

}  // namespace

int name_mapped_peers_as_ipv4() {
  static std::mutex mutex;
  static Rewritten rewritten_objects;
  const std::lock_guard<std::mutex> lock(mutex);
  ::dl_iterate_phdr(&rewrite_object, &rewritten_objects);
  int rewritten = 0;
  for (const auto& [object, slots] : rewritten_objects) rewritten += slots;
  return rewritten;
}

}  // namespace sgpu::rendezvous
