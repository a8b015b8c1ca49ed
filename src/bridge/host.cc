// The bridge's host side: arrays exchanged with a host on the same MLX, MLX's versions, the scan
// of the loaded objects for definers of MLX's symbols (the exchange guard, docs/DESIGN.md §5
// "Host arrays") and the library's pin against dlclose.
#include "src/bridge/mlx_bridge.h"
#include "src/bridge/mlx_compat.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/version.h"
#include "mlxkern/src/bridge/mod.rs.h"

#if defined(__APPLE__)
#include <mach-o/dyld.h>
#else
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace mx = mlx::core;

namespace mlxk {

std::unique_ptr<Array> array_from_host(size_t host) {
  return std::make_unique<Array>(*reinterpret_cast<const mx::array*>(host));
}

size_t array_to_host(const Array& a) { return reinterpret_cast<size_t>(new mx::array(a)); }

void host_array_free(size_t host) { delete reinterpret_cast<mx::array*>(host); }

rust::String mlx_version() { return rust::String(mx::version()); }

rust::String mlx_build_version() {
  return rust::String(std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) +
                      "." + std::to_string(MLX_VERSION_PATCH));
}

namespace {
// A symbol every build of MLX defines (mlx::core::version()).
constexpr const char* kMlxSymbol = "_ZN3mlx4core7versionEv";

// The loaded objects (file paths; "" for the main program), in load order.
std::vector<std::string> loaded_objects() {
  std::vector<std::string> found;
#if defined(__APPLE__)
  for (uint32_t i = 0, n = _dyld_image_count(); i < n; ++i) {
    const char* name = _dyld_get_image_name(i);
    found.emplace_back(name ? name : "");
  }
#else
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name ? info->dlpi_name
                                                                                   : "");
        return 0;
      },
      &found);
#endif
  return found;
}
}  // namespace

namespace {
// Changes whenever an object is loaded or unloaded (glibc's load and unload counters; on macOS
// the number of images).
uint64_t loader_generation() {
#if defined(__APPLE__)
  return _dyld_image_count();
#else
  uint64_t generation = 0;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t size, void* data) {
        uint64_t g = 0;
        if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
          g = (static_cast<uint64_t>(info->dlpi_adds) << 32) ^ info->dlpi_subs;
        }
        *static_cast<uint64_t*>(data) = g;
        return 1;  // the counters are the same in every entry: stop at the first
      },
      &generation);
  return generation;
#endif
}

#if !defined(__APPLE__)
// Whether the ELF file at `path` defines kMlxSymbol in its static symbol table (.symtab): MLX
// compiled into a program or library whose MLX symbols are not exported (an mlx-swift app),
// which dlsym cannot see. A stripped file has no .symtab, and such a copy stays unseen.
bool elf_defines_mlx(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > (off_t)sizeof(ElfW(Ehdr)))
    map = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return false;
  const auto* base = static_cast<const unsigned char*>(map);
  const size_t size = (size_t)st.st_size, want = strlen(kMlxSymbol) + 1;
  auto fits = [size](size_t offset, size_t length) {
    return offset <= size && length <= size - offset;
  };
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(base);
  bool found = false;
  const unsigned char elf_class = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == elf_class &&
      eh->e_shentsize == sizeof(ElfW(Shdr)) &&
      fits(eh->e_shoff, eh->e_shnum * sizeof(ElfW(Shdr)))) {
    const auto* sh = reinterpret_cast<const ElfW(Shdr)*>(base + eh->e_shoff);
    for (size_t i = 0; i < eh->e_shnum && !found; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
      const ElfW(Shdr)& strings = sh[sh[i].sh_link];
      if (!fits(sh[i].sh_offset, sh[i].sh_size) || !fits(strings.sh_offset, strings.sh_size))
        continue;
      const auto* syms = reinterpret_cast<const ElfW(Sym)*>(base + sh[i].sh_offset);
      const char* names = reinterpret_cast<const char*>(base + strings.sh_offset);
      for (size_t j = 0, n = sh[i].sh_size / sizeof(ElfW(Sym)); j < n && !found; ++j) {
        found = syms[j].st_shndx != SHN_UNDEF && syms[j].st_name < strings.sh_size &&
                want <= strings.sh_size - syms[j].st_name &&
                memcmp(names + syms[j].st_name, kMlxSymbol, want) == 0;
      }
    }
  }
  munmap(map, size);
  return found;
}
#endif

std::vector<std::string> mlx_definers() {
  // Every object that defines MLX's symbols itself, whatever its file is called (a renamed
  // libmlx, a framework, a library or program MLX is compiled into with its symbols visible):
  // look the symbol up in each loaded object and ask which object the address belongs to.
  std::vector<std::string> found;
  for (const auto& name : loaded_objects()) {
    void* handle = dlopen(name.empty() ? nullptr : name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) continue;
    void* address = dlsym(handle, kMlxSymbol);
    Dl_info info{};
    if (address && dladdr(address, &info) && info.dli_fname) {
      char resolved[PATH_MAX];
      std::string definer = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
      if (std::find(found.begin(), found.end(), definer) == found.end()) {
        found.push_back(definer);
      }
    }
    dlclose(handle);
  }
#if !defined(__APPLE__)
  // Then the copies dlsym cannot see: objects whose symbol table defines MLX's symbol.
  for (const auto& name : loaded_objects()) {
    char resolved[PATH_MAX];
    if (!realpath(name.empty() ? "/proc/self/exe" : name.c_str(), resolved)) continue;
    if (std::find(found.begin(), found.end(), resolved) == found.end() &&
        elf_defines_mlx(resolved))
      found.emplace_back(resolved);
  }
#endif
  return found;
}
}  // namespace

namespace {
// The objects defining MLX, as last scanned. The scan costs tens of microseconds; it is redone
// only when the set of loaded objects changed since the last one.
template <class Use>
auto with_mlx_definers(Use use) {
  static std::mutex mutex;
  static uint64_t generation = 0;
  static bool scanned = false;
  static std::vector<std::string> found;
  std::lock_guard<std::mutex> lock(mutex);
  uint64_t now = loader_generation();
  if (!scanned || now != generation || now == 0) {
    found = mlx_definers();
    generation = now;
    scanned = true;
  }
  return use(found);
}
}  // namespace

rust::Vec<rust::String> loaded_mlx_libraries() {
  return with_mlx_definers([](const std::vector<std::string>& found) {
    rust::Vec<rust::String> out;
    for (auto& f : found) out.push_back(rust::String(f));
    return out;
  });
}

size_t loaded_mlx_library_count() {
  return with_mlx_definers([](const std::vector<std::string>& found) { return found.size(); });
}

bool pin_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&pin_library), &info) || !info.dli_fname) return false;
  // RTLD_NOLOAD: only a reference to the already loaded library, now marked NODELETE.
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;
}

}  // namespace mlxk
