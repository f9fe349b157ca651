#include "tracking/validation.h"

#include <vector>

namespace sgpu::tracking {
namespace {

// Characters, not bytes: MLflow counts Python str characters.
std::size_t utf8_length(std::string_view text) {
  std::size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

// posixpath.normpath(key) == key, and not ".", "..*" or "/*" (MLflow's path_not_unique).
bool normal_path(std::string_view key) {
  if (key.empty()) return true;
  if (key == "." || key.front() == '/' || key.rfind("..", 0) == 0) return false;
  if (key.back() == '/') return false;
  std::size_t start = 0;
  while (start <= key.size()) {
    const std::size_t end = std::min(key.find('/', start), key.size());
    const std::string_view part = key.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

void check_key(std::string_view what, std::string_view key) {
  const std::string shown = std::string(key.substr(0, 100)) + (key.size() > 100 ? "..." : "");
  if (key.empty()) {
    throw TrackingError("tracking: a " + std::string(what) + " needs a non-empty key");
  }
  for (unsigned char c : key) {
    // Python's \w takes any letter or digit; bytes of a UTF-8 sequence stand for those.
    const bool ok = std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ' ' || c == ':' ||
                    c == '/' || c >= 0x80;
    if (!ok) {
      throw TrackingError("tracking: invalid " + std::string(what) + " key '" + shown +
                          "': keys may only contain letters, digits, underscores (_), dashes "
                          "(-), periods (.), spaces, colons (:) and slashes (/)");
    }
  }
  if (!normal_path(key)) {
    throw TrackingError("tracking: invalid " + std::string(what) + " key '" + shown +
                        "': a key is a path in MLflow's file store and must be in normal "
                        "form (no leading or trailing '/', no '//', '.' or '..' parts)");
  }
  if (utf8_length(key) > kMaxKeyLength) {
    throw TrackingError("tracking: " + std::string(what) + " key '" + shown + "' has " +
                        std::to_string(utf8_length(key)) + " characters; MLflow allows at most " +
                        std::to_string(kMaxKeyLength));
  }
}

std::string truncate_value(std::string_view value, std::size_t limit, bool* truncated) {
  if (truncated != nullptr) *truncated = false;
  std::size_t chars = 0;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if ((static_cast<unsigned char>(value[i]) & 0xC0) == 0x80) continue;
    if (chars == limit) {
      if (truncated != nullptr) *truncated = true;
      return std::string(value.substr(0, i));
    }
    ++chars;
  }
  return std::string(value);
}

}  // namespace sgpu::tracking
