// The framing of every file that crosses between caller and rank: staged calls, results.
//
// A record is a 32-byte header followed by the payload:
//   magic "SGPUREC1" | kind u32 | version u32 | payload size u64 | crc32 u32 | reserved u32
// (little-endian). Decoding checks all of it, so a truncated, corrupted or foreign file is
// reported as a RecordError that says which check failed, and is never read as a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sgpu::serialize {

// kCall: a function's staged CallRecord; kResult: a rank's return value; kWorkerCall: a
// worker program's staged payload; kException: the exception a worker rank raised, as
// the worker encodes it (launcher/launcher.h, WorkerCall).
enum class RecordKind : std::uint32_t { kCall = 1, kResult = 2, kWorkerCall = 3, kException = 4 };

inline constexpr std::size_t kRecordHeaderSize = 32;

class RecordError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RecordTooLarge : public RecordError {
 public:
  // "record of N bytes exceeds the limit of M bytes", then "; " and `advice` where there is
  // some (what the caller can change, which a record does not know).
  RecordTooLarge(std::size_t size, std::size_t limit, const std::string& advice = "");
  std::size_t size() const { return size_; }
  std::size_t limit() const { return limit_; }

 private:
  std::size_t size_;
  std::size_t limit_;
};

std::string encode_record(RecordKind kind, std::string_view payload);

// Returns the payload. Throws RecordTooLarge when the payload exceeds `limit` and
// RecordError when the bytes are not one whole, intact record of `kind`.
std::string decode_record(std::string_view bytes, RecordKind kind, std::size_t limit);

// Writes atomically: a reader sees the whole record or no file at all.
void write_record_file(const std::filesystem::path& path, RecordKind kind,
                       std::string_view payload);

// Reads and decodes; checks the file's size against `limit` before reading it.
std::string read_record_file(const std::filesystem::path& path, RecordKind kind, std::size_t limit);

}  // namespace sgpu::serialize
