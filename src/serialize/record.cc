#include "serialize/record.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "contract/atomic_file.h"

namespace sgpu::serialize {
namespace {

constexpr char kMagic[8] = {'S', 'G', 'P', 'U', 'R', 'E', 'C', '1'};
constexpr std::uint32_t kVersion = 1;

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_le(std::string_view bytes, std::size_t offset, int width) {
  std::uint64_t v = 0;
  for (int i = 0; i < width; ++i) {
    v |= std::uint64_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  }
  return v;
}

std::uint32_t checksum(std::string_view payload) {
  // zlib's crc32 takes a uInt length; feed large payloads in pieces.
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* data = reinterpret_cast<const Bytef*>(payload.data());
  std::size_t left = payload.size();
  while (left > 0) {
    const uInt n = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, data, n);
    data += n;
    left -= n;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string size_text(std::size_t bytes) {
  std::ostringstream s;
  if (bytes >= (std::size_t{1} << 20)) {
    s << bytes << " bytes (" << (bytes >> 20) << " MiB)";
  } else {
    s << bytes << " bytes";
  }
  return s.str();
}

}  // namespace

RecordTooLarge::RecordTooLarge(std::size_t size, std::size_t limit, const std::string& advice)
    : RecordError("record of " + size_text(size) + " exceeds the limit of " + size_text(limit) +
                  (advice.empty() ? "" : "; " + advice)),
      size_(size),
      limit_(limit) {}

std::string encode_record(RecordKind kind, std::string_view payload) {
  std::string out;
  out.reserve(kRecordHeaderSize + payload.size());
  out.append(kMagic, sizeof kMagic);
  put_u32(out, static_cast<std::uint32_t>(kind));
  put_u32(out, kVersion);
  put_u64(out, payload.size());
  put_u32(out, checksum(payload));
  put_u32(out, 0);
  out.append(payload);
  return out;
}

std::string decode_record(std::string_view bytes, RecordKind kind, std::size_t limit) {
  if (bytes.size() < kRecordHeaderSize) {
    throw RecordError("truncated record: " + std::to_string(bytes.size()) +
                      " bytes, shorter than the " + std::to_string(kRecordHeaderSize) +
                      "-byte header");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw RecordError("not an sgpu record (bad magic)");
  }
  const auto got_kind = static_cast<std::uint32_t>(get_le(bytes, 8, 4));
  if (got_kind != static_cast<std::uint32_t>(kind)) {
    throw RecordError("record of kind " + std::to_string(got_kind) + " where kind " +
                      std::to_string(static_cast<std::uint32_t>(kind)) + " was expected");
  }
  const auto version = static_cast<std::uint32_t>(get_le(bytes, 12, 4));
  if (version != kVersion) {
    throw RecordError("record version " + std::to_string(version) + ", this sgpu reads " +
                      std::to_string(kVersion));
  }
  const std::uint64_t size = get_le(bytes, 16, 8);
  if (size > limit) throw RecordTooLarge(size, limit);
  if (bytes.size() - kRecordHeaderSize != size) {
    throw RecordError("truncated record: header announces " + std::to_string(size) +
                      " payload bytes, file holds " +
                      std::to_string(bytes.size() - kRecordHeaderSize));
  }
  std::string_view payload = bytes.substr(kRecordHeaderSize);
  const auto want_crc = static_cast<std::uint32_t>(get_le(bytes, 24, 4));
  if (checksum(payload) != want_crc) {
    throw RecordError("corrupt record: payload checksum does not match its header");
  }
  return std::string(payload);
}

void write_record_file(const std::filesystem::path& path, RecordKind kind,
                       std::string_view payload) {
  contract::write_file_atomically(path, encode_record(kind, payload), {.mode = 0600});
}

std::string read_record_file(const std::filesystem::path& path, RecordKind kind,
                             std::size_t limit) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw RecordError("cannot read " + path.string() + ": " + ec.message());
  if (size > limit + kRecordHeaderSize) throw RecordTooLarge(size - kRecordHeaderSize, limit);
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) {
    throw RecordError("cannot read " + path.string() + ": short read");
  }
  return decode_record(bytes, kind, limit);
}

}  // namespace sgpu::serialize
