#include "serialize/record.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "serialize/error_record.h"

namespace sgpu::serialize {
namespace {

RC_GTEST_PROP(Record, RoundTripsAnyPayload, (const std::string& payload)) {
  RC_ASSERT(decode_record(encode_record(RecordKind::kResult, payload), RecordKind::kResult,
                          payload.size()) == payload);
}

RC_GTEST_PROP(Record, AnyTruncationIsDetected, (const std::string& payload)) {
  const std::string bytes = encode_record(RecordKind::kResult, payload);
  const auto cut = *rc::gen::inRange<std::size_t>(0, bytes.size());
  RC_ASSERT_THROWS_AS(decode_record(bytes.substr(0, cut), RecordKind::kResult, 1 << 20),
                      RecordError);
}

RC_GTEST_PROP(Record, AnySingleByteCorruptionIsDetected, (const std::string& payload)) {
  std::string bytes = encode_record(RecordKind::kResult, payload);
  const auto at = *rc::gen::inRange<std::size_t>(0, bytes.size());
  const auto flip = *rc::gen::inRange<int>(1, 256);
  // The reserved header word is not checked; every other byte is.
  RC_PRE(at < 28 || at >= kRecordHeaderSize);
  bytes[at] = static_cast<char>(bytes[at] ^ flip);
  RC_ASSERT_THROWS_AS(decode_record(bytes, RecordKind::kResult, 1 << 20), RecordError);
}

TEST(Record, RejectsOtherKinds) {
  const std::string bytes = encode_record(RecordKind::kCall, "x");
  EXPECT_THROW(decode_record(bytes, RecordKind::kResult, 10), RecordError);
}

TEST(Record, TooLargeNamesSizeAndLimit) {
  const std::string bytes = encode_record(RecordKind::kResult, std::string(3000, 'a'));
  try {
    decode_record(bytes, RecordKind::kResult, 1000);
    FAIL() << "no error";
  } catch (const RecordTooLarge& e) {
    EXPECT_EQ(e.size(), 3000u);
    EXPECT_EQ(e.limit(), 1000u);
    EXPECT_NE(std::string(e.what()).find("3000 bytes"), std::string::npos) << e.what();
  }
}

TEST(Record, FilesAreWrittenWholeAndCheckedOnRead) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("record_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "result.bin";
  write_record_file(path, RecordKind::kResult, "payload");
  // Nothing is left beside it (the content went through a sibling renamed into place).
  std::vector<std::filesystem::path> in_folder;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    in_folder.push_back(entry.path());
  EXPECT_EQ(in_folder, std::vector<std::filesystem::path>{path});
  EXPECT_EQ(read_record_file(path, RecordKind::kResult, 100), "payload");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 2);
  EXPECT_THROW(read_record_file(path, RecordKind::kResult, 100), RecordError);
  EXPECT_THROW(read_record_file(dir / "missing.bin", RecordKind::kResult, 100), RecordError);
  std::filesystem::remove_all(dir);
}

// Numbers that fit no field (a torn or foreign file) leave the field unset; found by
// tests/fuzz/decoders_fuzz.cc, which under UndefinedBehaviorSanitizer caught the
// conversion of 1.733e28 to an integer (tests/fuzz/corpus/error_record_huge_timestamp).
TEST(ErrorRecord, NumbersOutOfRangeLeaveTheirFieldsUnset) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("sgpu-error-record-" + std::to_string(::getpid()) + ".json");
  for (const char* text :
       {R"({"type": "E", "message": "boom", "rank": 1e20, "timestamp_ns": 1.733e28})",
        R"({"type": "E", "message": "boom", "rank": 3000000000, "timestamp_ns": -5})",
        R"({"type": "E", "message": "boom", "rank": "3", "timestamp_ns": 18446744073709551615})"}) {
    std::ofstream(path) << text;
    const auto record = read_error_record(path);
    ASSERT_TRUE(record.has_value()) << text;
    EXPECT_EQ(record->message, "boom") << text;
    EXPECT_EQ(record->rank, -1) << text;
    EXPECT_EQ(record->time.time_since_epoch().count(), 0) << text;
  }
  std::ofstream(path) << R"({"type": "E", "message": "boom", "rank": 3, "timestamp_ns": 7000})";
  const auto record = read_error_record(path);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->rank, 3);
  EXPECT_EQ(
      std::chrono::duration_cast<std::chrono::nanoseconds>(record->time.time_since_epoch()).count(),
      7000);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sgpu::serialize
