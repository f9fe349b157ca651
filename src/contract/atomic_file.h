// Replacing a file's content whole: the content goes to a sibling of a unique name, which
// is then renamed over the file, so a reader (or a crash) finds the old content or the new,
// never a part. Run records, error records, tracking files and checkpoints all write
// this way; they differ only in how durable the result must be.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string_view>

namespace sgpu::contract {

enum class Durability {
  // Rename only: other processes see the whole file or none; a crash of the machine may
  // lose it. For files that live no longer than the call (records, tracking spools).
  kAtomic,
  // The content is fsynced before the rename and the folder after it: once the call
  // returns, the file survives a crash of the machine (checkpoints).
  kSynced,
};

struct AtomicWrite {
  Durability durability = Durability::kAtomic;
  mode_t mode = 0644;
  // Runs once the content is written, before the rename (a test's crash point, say).
  std::function<void()> before_rename;
};

// Throws std::system_error naming the path; the sibling is removed on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                           const AtomicWrite& how = {});

// For content written another way into `written` (a sibling of `path`, fsynced by the
// writer when kSynced is asked): renames it over `path`, then fsyncs the folder for
// kSynced. Throws std::system_error.
void publish_file(const std::filesystem::path& written, const std::filesystem::path& path,
                  Durability durability);

// A name in path's folder no other writer uses: ".<name>.<pid>-<n>.tmp".
std::filesystem::path sibling_for_writing(const std::filesystem::path& path);

}  // namespace sgpu::contract
