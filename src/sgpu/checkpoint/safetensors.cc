// Byte order: safetensors is little-endian; sgpu runs on little-endian hosts (x86-64 and
// aarch64 Linux), so tensor bytes are copied as they are.
#include "sgpu/checkpoint/safetensors.h"

#include <c10/util/accumulate.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace sgpu::checkpoint {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeRow {
  Dtype dtype;
  const char* name;
  std::size_t size;
  at::ScalarType scalar;
};
constexpr DtypeRow kDtypes[] = {
    {Dtype::kF64, "F64", 8, at::kDouble}, {Dtype::kF32, "F32", 4, at::kFloat},
    {Dtype::kF16, "F16", 2, at::kHalf},   {Dtype::kBF16, "BF16", 2, at::kBFloat16},
    {Dtype::kI64, "I64", 8, at::kLong},   {Dtype::kI32, "I32", 4, at::kInt},
    {Dtype::kI16, "I16", 2, at::kShort},  {Dtype::kI8, "I8", 1, at::kChar},
    {Dtype::kU8, "U8", 1, at::kByte},     {Dtype::kBool, "BOOL", 1, at::kBool},
};

const DtypeRow& row(Dtype dtype) {
  for (const auto& r : kDtypes) {
    if (r.dtype == dtype) return r;
  }
  throw CheckpointError("unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

[[noreturn]] void fail(const std::string& file, const std::string& tensor,
                       const std::string& what) {
  std::string message = "safetensors file " + file;
  if (!tensor.empty()) message += ", tensor '" + tensor + "'";
  throw CheckpointError(message + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

// The little-endian header length in a file's first 8 bytes.
std::uint64_t header_length(const std::uint8_t* first8) {
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | first8[i];
  return length;
}

TensorEntry parse_entry(const std::string& file, const std::string& name, const json& value) {
  if (!value.is_object()) fail(file, name, "entry is not a JSON object");
  TensorEntry entry;
  entry.name = name;
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) fail(file, name, std::string("entry has no \"") + key + "\"");
  }
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) fail(file, name, "dtype is not a string");
  const std::string dtype_text = dtype.get<std::string>();
  const std::optional<Dtype> known = dtype_from_name(dtype_text);
  if (known) entry.dtype = *known;
  if (!known) {
    fail(file, name,
         "dtype \"" + dtype_text +
             "\" is not one sgpu reads (F64, F32, F16, BF16, "
             "I64, I32, I16, I8, U8, BOOL)");
  }
  const json& shape = value["shape"];
  if (!shape.is_array()) fail(file, name, "shape is not an array");
  std::uint64_t numel = 1;
  for (const json& dim : shape) {
    if (!dim.is_number_unsigned())
      fail(file, name,
           "shape " + shape.dump() +
               " has a dimension "
               "that is not a non-negative integer");
    const std::uint64_t d = dim.get<std::uint64_t>();
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        __builtin_mul_overflow(numel, d, &numel)) {
      fail(file, name, "shape " + shape.dump() + " overflows");
    }
    entry.shape.push_back(static_cast<std::int64_t>(d));
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(file, name, "data_offsets is not a pair of non-negative integers");
  }
  entry.begin = offsets[0].get<std::uint64_t>();
  entry.end = offsets[1].get<std::uint64_t>();
  if (entry.end < entry.begin) {
    fail(file, name,
         "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
             "] end before they begin");
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, row(entry.dtype).size, &bytes) ||
      bytes != entry.end - entry.begin) {
    fail(file, name,
         "shape " + shape.dump() + " of " + dtype_text + " needs " +
             (bytes == 0 && numel != 0 ? std::string("too many") : std::to_string(bytes)) +
             " bytes but data_offsets span " + std::to_string(entry.end - entry.begin));
  }
  return entry;
}

}  // namespace

std::size_t dtype_size(Dtype dtype) { return row(dtype).size; }
const char* dtype_name(Dtype dtype) { return row(dtype).name; }
at::ScalarType scalar_type_of(Dtype dtype) { return row(dtype).scalar; }

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const auto& r : kDtypes) {
    if (name == r.name) return r.dtype;
  }
  return std::nullopt;
}

Dtype dtype_of(at::ScalarType type) {
  for (const auto& r : kDtypes) {
    if (r.scalar == type) return r.dtype;
  }
  throw CheckpointError(std::string("tensors of type ") + c10::toString(type) +
                        " cannot be stored; safetensors here takes F64, F32, F16, BF16, I64, "
                        "I32, I16, I8, U8 and BOOL");
}

std::int64_t TensorEntry::numel() const { return c10::multiply_integers(shape); }

const TensorEntry* Header::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// The header's JSON, whose top-level names are unique.
json parse_json(const char* text, std::uint64_t length, const std::string& file) {
  // Duplicate names: nlohmann keeps the last; the callback sees every top-level key.
  std::set<std::string> seen;
  std::string duplicate;
  json parsed;
  try {
    parsed =
        json::parse(text, text + length, [&](int depth, json::parse_event_t event, json& value) {
          if (event == json::parse_event_t::key && depth == 1 &&
              !seen.insert(value.get<std::string>()).second && duplicate.empty()) {
            duplicate = value.get<std::string>();
          }
          return true;
        });
  } catch (const json::exception& e) {
    fail(file, "", std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail(file, duplicate, "the name appears twice in the header");
  if (!parsed.is_object()) fail(file, "", "header is not a JSON object");
  return parsed;
}

// The tensors, sorted by where their data is, cover the data section exactly: no overlap,
// no hole, nothing past its end or after the last.
void check_layout(Header& header, std::uint64_t file_size, const std::string& file) {
  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const std::uint64_t data_size = file_size - header.data_start;
  std::uint64_t cursor = 0;
  for (const auto& t : header.tensors) {
    if (t.begin != cursor) {
      fail(file, t.name,
           "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] " +
               (t.begin < cursor ? "overlap the previous tensor"
                                 : "leave a hole after the previous tensor") +
               " (which ends at " + std::to_string(cursor) + ")");
    }
    if (t.end > data_size) {
      fail(file, t.name,
           "data_offsets end at " + std::to_string(t.end) + " but the data section " + "has " +
               std::to_string(data_size) + " bytes; the file is truncated or the header lies");
    }
    cursor = t.end;
  }
  if (cursor != data_size) {
    fail(file, "",
         "the data section has " + std::to_string(data_size) +
             " bytes but the tensors "
             "cover " +
             std::to_string(cursor) + "; trailing bytes are not allowed");
  }
}

}  // namespace

Header parse_header(std::span<const std::uint8_t> prefix, std::uint64_t file_size,
                    const std::string& file) {
  if (file_size < 8 || prefix.size() < 8) {
    fail(file, "",
         "file is " + std::to_string(file_size) +
             " bytes, shorter than the 8-byte header length; it is truncated or not "
             "a safetensors file");
  }
  const std::uint64_t length = header_length(prefix.data());
  if (length > kMaxHeaderBytes) {
    fail(file, "", "header length " + std::to_string(length) + " is above the 100 MB limit");
  }
  if (length > file_size - 8) {
    fail(file, "",
         "header length " + std::to_string(length) + " runs past the end of the " +
             std::to_string(file_size) + "-byte file; it is truncated or corrupted");
  }
  if (prefix.size() < 8 + length) fail(file, "", "header not read in full");
  const char* text = reinterpret_cast<const char*>(prefix.data() + 8);
  if (length == 0 || text[0] != '{') fail(file, "", "header does not start with '{'");

  const json parsed = parse_json(text, length, file);

  Header header;
  header.data_start = 8 + length;
  for (const auto& [name, value] : parsed.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(file, "", "__metadata__ is not an object of strings");
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) fail(file, "", "__metadata__ \"" + key + "\" is not a string");
        header.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_entry(file, name, value));
  }
  check_layout(header, file_size, file);
  return header;
}

Parsed parse_buffer(std::span<const std::uint8_t> bytes, const std::string& file) {
  Parsed out;
  out.header = parse_header(bytes, bytes.size(), file);
  for (const auto& t : out.header.tensors) {
    at::Tensor tensor = at::empty(t.shape, at::TensorOptions().dtype(scalar_type_of(t.dtype)));
    if (t.end > t.begin) {
      std::memcpy(tensor.data_ptr(), bytes.data() + out.header.data_start + t.begin,
                  t.end - t.begin);
    }
    out.tensors.emplace(t.name, std::move(tensor));
  }
  return out;
}

SafetensorsReader::SafetensorsReader(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path_.string(), "", "cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    fail(path_.string(), "", "cannot stat: " + errno_text());
  }
  file_size_ = static_cast<std::uint64_t>(st.st_size);
  try {
    std::vector<std::uint8_t> prefix(std::min<std::uint64_t>(file_size_, 8));
    read_at(0, prefix.data(), prefix.size(), "header length");
    if (prefix.size() == 8) {
      const std::uint64_t length = header_length(prefix.data());
      if (length <= kMaxHeaderBytes && length <= file_size_ - 8) {
        prefix.resize(8 + length);
        read_at(8, prefix.data() + 8, length, "header");
      }
    }
    header_ = parse_header(prefix, file_size_, path_.string());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::read_at(std::uint64_t offset, void* out, std::size_t size,
                                const std::string& what) const {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(path_.string(), "",
           "cannot read " + what + ": " + (n < 0 ? errno_text() : "end of file"));
    }
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
}

const TensorEntry& SafetensorsReader::entry(const std::string& name) const {
  const TensorEntry* t = header_.find(name);
  if (t == nullptr) fail(path_.string(), name, "no such tensor in the file");
  return *t;
}

void SafetensorsReader::read_data(const TensorEntry& t, void* out) const {
  if (t.end > t.begin) {
    read_at(header_.data_start + t.begin, out, t.end - t.begin, "tensor '" + t.name + "'");
  }
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorEntry& t = entry(name);
  at::Tensor tensor = at::empty(t.shape, at::TensorOptions().dtype(scalar_type_of(t.dtype)));
  read_data(t, tensor.data_ptr());
  return tensor;
}

void SafetensorsReader::read_into(const std::string& name, const at::Tensor& out) const {
  const TensorEntry& t = entry(name);
  if (out.device() != at::kCPU || !out.is_contiguous() ||
      out.scalar_type() != scalar_type_of(t.dtype) || out.numel() != t.numel()) {
    fail(path_.string(), name,
         "cannot read " + std::string(dtype_name(t.dtype)) + " " + std::to_string(t.numel()) +
             " elements into a " + std::string(c10::toString(out.scalar_type())) + " tensor of " +
             std::to_string(out.numel()) + " on " + out.device().str() +
             " (it must be contiguous, on the CPU, of the same dtype and size)");
  }
  read_data(t, out.data_ptr());
}

std::vector<std::uint8_t> SafetensorsReader::read_bytes(const std::string& name) const {
  const TensorEntry& t = entry(name);
  std::vector<std::uint8_t> bytes(t.end - t.begin);
  read_data(t, bytes.data());
  return bytes;
}

std::vector<std::uint8_t> tensor_bytes(const at::Tensor& tensor) {
  const at::Tensor c = tensor.detach().to(at::kCPU).contiguous();
  std::vector<std::uint8_t> bytes(c.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), c.data_ptr(), bytes.size());
  return bytes;
}

std::uint64_t write_safetensors(const std::filesystem::path& path,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                std::map<std::string, std::string> metadata) {
  const std::string file = path.string();
  metadata.emplace("format", "pt");
  json header = json::object();
  header["__metadata__"] = metadata;
  // Larger elements first (stable), as Python's safetensors does: every tensor then starts
  // at a multiple of its element size, since the data section starts 8-byte aligned.
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });
  std::vector<at::Tensor> contiguous;
  std::uint64_t offset = 0;
  std::set<std::string> names;
  for (const std::size_t i : order) {
    const auto& [name, tensor] = tensors[i];
    if (name == "__metadata__") fail(file, name, "the name is reserved for metadata");
    if (!names.insert(name).second) fail(file, name, "the name is given twice");
    const Dtype dtype = dtype_of(tensor.scalar_type());
    contiguous.push_back(tensor.detach().to(at::kCPU).contiguous());
    const std::uint64_t bytes = contiguous.back().nbytes();
    header[name] = {{"dtype", dtype_name(dtype)},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // data starts 8-byte aligned
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(file, "", "cannot create: " + errno_text());
  auto write_all = [&](const void* data, std::size_t size, const std::string& tensor) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string why = errno_text();
        ::close(fd);
        fail(file, tensor, "cannot write: " + why);
      }
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  };
  write_all(length, 8, "");
  write_all(text.data(), text.size(), "");
  for (std::size_t k = 0; k < order.size(); ++k) {
    write_all(contiguous[k].data_ptr(), contiguous[k].nbytes(), tensors[order[k]].first);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    fail(file, "", "cannot fsync: " + why);
  }
  if (::close(fd) != 0) fail(file, "", "cannot close: " + errno_text());
  return 8 + text.size() + offset;
}

}  // namespace sgpu::checkpoint
