// The safetensors reader and writer: round trips of every dtype, the files Python's
// safetensors package writes and reads, and every kind of bad input gives a
// CheckpointError naming the file and the tensor (properties: any truncation, any byte
// flip, any lying header).
#include "sgpu/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace sgpu::checkpoint;

fs::path temp_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("sgpu-safetensors-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::uint8_t> slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::uint8_t> with_header(const std::string& json, std::size_t data_bytes) {
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(json.size() >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> every_dtype() {
  return {{"f64", at::arange(6, at::kDouble).reshape({2, 3}) / 3},
          {"f32", at::arange(5, at::kFloat) - 2.5},
          {"f16", at::arange(4, at::kHalf)},
          {"bf16", at::arange(4, at::kBFloat16) * 0.5},
          {"i64", at::arange(3, at::kLong) - (std::int64_t{1} << 40)},
          {"i32", at::arange(3, at::kInt) - 7},
          {"i16", at::arange(3, at::kShort)},
          {"i8", at::arange(3, at::kChar) - 1},
          {"u8", at::arange(3, at::kByte) + 250},
          {"bool", at::arange(3, at::kLong).remainder(2) == 0},
          {"empty", at::zeros({0, 4})},
          {"scalar", at::scalar_tensor(3.5, at::kDouble)}};
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

TEST(Safetensors, EveryDtypeRoundTrips) {
  const fs::path file = temp_dir("round") / "t.safetensors";
  const auto tensors = every_dtype();
  const std::uint64_t size = write_safetensors(file, tensors, {{"step", "7"}});
  EXPECT_EQ(size, fs::file_size(file));
  SafetensorsReader reader(file);
  EXPECT_EQ(reader.header().metadata.at("format"), "pt");
  EXPECT_EQ(reader.header().metadata.at("step"), "7");
  EXPECT_EQ(reader.header().data_start % 8, 0u);
  for (const auto& entry : reader.header().tensors) {
    EXPECT_EQ((reader.header().data_start + entry.begin) % dtype_size(entry.dtype), 0u)
        << entry.name;
  }
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor back = reader.read(name);
    EXPECT_EQ(back.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(at::equal(back, tensor)) << name;
  }
}

TEST(Safetensors, ReadsIntoATensorThatFitsAndRefusesOneThatDoesNot) {
  const fs::path file = temp_dir("into") / "t.safetensors";
  const at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  write_safetensors(file, {{"w", w}});
  SafetensorsReader reader(file);
  at::Tensor flat = at::zeros({12}, at::kFloat);  // any shape with the same elements
  reader.read_into("w", flat);
  EXPECT_TRUE(at::equal(flat, w.reshape(-1)));
  for (const at::Tensor& wrong : {at::zeros({12}, at::kDouble), at::zeros({11}, at::kFloat),
                                  at::zeros({4, 3}, at::kFloat).t()}) {
    try {
      reader.read_into("w", wrong);
      ADD_FAILURE() << "read into " << wrong.sizes() << " " << wrong.scalar_type();
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file.string()), std::string::npos) << what;
      EXPECT_NE(what.find("'w'"), std::string::npos) << what;
      EXPECT_NE(what.find("contiguous, on the CPU, of the same dtype and size"), std::string::npos)
          << what;
    }
  }
}

RC_GTEST_PROP(Safetensors, RandomTensorsRoundTripThroughTheBuffer, ()) {
  const int count = *rc::gen::inRange(0, 6);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < count; ++i) {
    const auto shape = *rc::gen::container<std::vector<std::int64_t>>(
        *rc::gen::inRange(0, 4), rc::gen::inRange<std::int64_t>(0, 5));
    const int kind = *rc::gen::inRange(0, 3);
    const auto type = kind == 0 ? at::kFloat : kind == 1 ? at::kLong : at::kBFloat16;
    tensors.emplace_back("t" + std::to_string(i), at::randn(shape).mul(100).to(type));
  }
  const fs::path file = temp_dir("prop") / "t.safetensors";
  write_safetensors(file, tensors);
  const Parsed parsed = parse_buffer(slurp(file), file.string());
  RC_ASSERT(parsed.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) RC_ASSERT(at::equal(parsed.tensors.at(name), tensor));
}

RC_GTEST_PROP(Safetensors, AnyTruncationIsAnErrorNamingTheFile, ()) {
  const fs::path file = temp_dir("trunc") / "t.safetensors";
  write_safetensors(file, {{"w", at::arange(40, at::kFloat)}, {"b", at::arange(3, at::kLong)}});
  auto bytes = slurp(file);
  const std::size_t keep = *rc::gen::inRange<std::size_t>(0, bytes.size());
  bytes.resize(keep);
  spit(file, bytes);
  const std::string message = message_of([&] { SafetensorsReader reader(file); });
  RC_ASSERT(message.find(file.string()) != std::string::npos);
}

// safetensors carries no checksum: a flipped data byte is read back as it is (the
// checkpoint's CRC-32 is what catches it); a flipped byte of the length or the header is
// an error naming the file, or a header that still parses, whose tensors have its sizes.
RC_GTEST_PROP(Safetensors, AByteFlipInTheDataReadsBackFlippedElsewhereErrorOrRightSizes, ()) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
  auto bytes = with_header(header, 24);
  for (std::size_t i = 0; i < 24; ++i) bytes[8 + header.size() + i] = static_cast<std::uint8_t>(i);
  const std::size_t data_start = 8 + header.size();
  const std::size_t at = *rc::gen::inRange<std::size_t>(0, bytes.size());
  bytes[at] ^= *rc::gen::inRange<int>(1, 256);
  if (at >= data_start) {
    const Parsed parsed = parse_buffer(bytes, "flipped.safetensors");  // must not throw
    std::vector<std::uint8_t> data(24);
    for (const auto& t : parsed.header.tensors) {
      const at::Tensor& tensor = parsed.tensors.at(t.name);
      RC_ASSERT(tensor.nbytes() == t.end - t.begin);
      std::memcpy(data.data() + t.begin, tensor.data_ptr(), tensor.nbytes());
    }
    RC_ASSERT(data == std::vector<std::uint8_t>(bytes.begin() + data_start, bytes.end()));
    return;
  }
  try {
    const Parsed parsed = parse_buffer(bytes, "flipped.safetensors");
    for (const auto& t : parsed.header.tensors) {
      RC_ASSERT(parsed.tensors.at(t.name).nbytes() == t.end - t.begin);
    }
  } catch (const CheckpointError& e) {
    RC_ASSERT(std::string(e.what()).find("flipped.safetensors") != std::string::npos);
  }
}

struct BadCase {
  const char* what;
  std::string header;
  std::size_t data;
  const char* expect;  // in the message, besides the file
};

TEST(Safetensors, BadHeadersNameTheFileAndTheTensor) {
  const std::vector<BadCase> cases = {
      {"json", R"({"w": {"dtype": "F32", )", 0, "not valid JSON"},
      {"not object", R"(["w"])", 0, "does not start with '{'"},
      {"dtype", R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16, "tensor 'w'"},
      {"size lie", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "tensor 'w'"},
      {"past end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "tensor 'w'"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensor 'b'"},
      {"hole",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, "tensor 'b'"},
      {"duplicate",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       4, "tensor 'a'"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "tensor 'w'"},
      {"overflow", R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
       8, "tensor 'w'"},
      {"reversed", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4, "tensor 'w'"},
      {"trailing", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 9, "trailing"},
      {"metadata", R"({"__metadata__":{"format":1}})", 0, "__metadata__"},
      {"missing field", R"({"w":{"dtype":"U8","shape":[1]}})", 1, "tensor 'w'"},
  };
  const fs::path dir = temp_dir("bad");
  for (const auto& c : cases) {
    const fs::path file = dir / (std::string(c.what) + ".safetensors");
    spit(file, with_header(c.header, c.data));
    const std::string message = message_of([&] { SafetensorsReader reader(file); });
    EXPECT_NE(message.find(file.string()), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.what << ": " << message;
  }
  // A length that lies about the header.
  auto bytes = with_header("{}", 0);
  bytes[0] = 200;
  spit(dir / "length.safetensors", bytes);
  EXPECT_NE(
      message_of([&] { SafetensorsReader reader(dir / "length.safetensors"); }).find("runs past"),
      std::string::npos);
  EXPECT_NE(
      message_of([&] { SafetensorsReader reader(dir / "absent.safetensors"); }).find("cannot open"),
      std::string::npos);
  write_safetensors(dir / "good.safetensors", {{"w", at::ones({2})}});
  EXPECT_NE(message_of([&] {
              SafetensorsReader(dir / "good.safetensors").read("nope");
            }).find("tensor 'nope'"),
            std::string::npos);
}

int run_python(const std::string& script, const fs::path& dir) {
  const fs::path path = dir / "check.py";
  std::ofstream(path) << script;
  const std::string command =
      std::string(SGPU_TEST_PYTHON) + " " + path.string() + " " + dir.string();
  return std::system(command.c_str());
}

// The values both sides compute: arange-based, per dtype.
constexpr const char* kPythonValues = R"(
import sys, torch
from safetensors.torch import load_file, save_file
d = sys.argv[1]
expected = {
  "f64": (torch.arange(6, dtype=torch.float64).reshape(2, 3) / 3),
  "f32": torch.arange(5, dtype=torch.float32) - 2.5,
  "f16": torch.arange(4, dtype=torch.float16),
  "bf16": torch.arange(4, dtype=torch.bfloat16) * 0.5,
  "i64": torch.arange(3, dtype=torch.int64) - (1 << 40),
  "i32": torch.arange(3, dtype=torch.int32) - 7,
  "i16": torch.arange(3, dtype=torch.int16),
  "i8": torch.arange(3, dtype=torch.int8) - 1,
  "u8": torch.arange(3, dtype=torch.uint8) + 250,
  "bool": torch.tensor([True, False, True]),
  "empty": torch.zeros(0, 4),
  "scalar": torch.tensor(3.5, dtype=torch.float64),
}
)";

TEST(Safetensors, PythonReadsWhatSgpuWrites) {
  const fs::path dir = temp_dir("to-python");
  write_safetensors(dir / "sgpu.safetensors", every_dtype());
  const std::string script = std::string(kPythonValues) + R"(
got = load_file(d + "/sgpu.safetensors")
assert set(got) == set(expected), (sorted(got), sorted(expected))
for k, v in expected.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
print("python: sgpu's file matches")
)";
  EXPECT_EQ(run_python(script, dir), 0);
}

TEST(Safetensors, SgpuReadsWhatPythonWrites) {
  const fs::path dir = temp_dir("from-python");
  const std::string script = std::string(kPythonValues) + R"(
save_file(expected, d + "/python.safetensors", metadata={"format": "pt", "by": "python"})
)";
  ASSERT_EQ(run_python(script, dir), 0);
  SafetensorsReader reader(dir / "python.safetensors");
  EXPECT_EQ(reader.header().metadata.at("by"), "python");
  for (const auto& [name, tensor] : every_dtype()) {
    const at::Tensor back = reader.read(name);
    EXPECT_EQ(back.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back, tensor)) << name;
  }
}

}  // namespace
