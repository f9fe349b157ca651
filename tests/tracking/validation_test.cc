// MLflow's key rules and limits, as the tracking core checks them before any store sees a
// key.
#include "tracking/validation.h"

#include <gtest/gtest.h>

#include <string>

#include "sgpu/errors.h"

namespace sgpu::tracking {
namespace {

TEST(Validation, AcceptsWhatMlflowAccepts) {
  for (const char* key : {"loss", "train/loss", "a.b-c_d", "epoch 1: acc", "x/y/z"}) {
    EXPECT_NO_THROW(check_key("metric", key)) << key;
  }
}

TEST(Validation, RefusesWhatMlflowRefusesWithTheKeyAndTheRule) {
  for (const char* key :
       {"", "a//b", "/a", "a/", "../a", "a/../b", ".", "a/./b", "loss!", "a\"b", "tab\there"}) {
    EXPECT_THROW(check_key("metric", key), TrackingError) << key;
  }
  try {
    check_key("param", std::string(251, 'k'));
    FAIL() << "a 251-character key passed";
  } catch (const TrackingError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 250"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_key("param", std::string(250, 'k')));
}

TEST(Validation, TruncatesLongValuesByCharacters) {
  bool truncated = false;
  EXPECT_EQ(truncate_value(std::string(7000, 'v'), kMaxParamValueLength, &truncated).size(), 6000u);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(truncate_value("short", kMaxParamValueLength, &truncated), "short");
  EXPECT_FALSE(truncated);
  // Two-byte characters are kept whole: 3 characters of "ééé..." is 6 bytes.
  EXPECT_EQ(truncate_value("éééé", 3), "ééé");
}

}  // namespace
}  // namespace sgpu::tracking
