#include "tracking/file/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

#include "contract/atomic_file.h"
#include "tracking/ids.h"

namespace sgpu::tracking {
namespace fs = std::filesystem;
namespace {

// MLflow keeps RunStatus as an integer in meta.yaml.
int status_code(RunStatus status) {
  switch (status) {
    case RunStatus::kRunning:
      return 1;
    case RunStatus::kFinished:
      return 3;
    case RunStatus::kFailed:
      return 4;
    case RunStatus::kKilled:
      return 5;
  }
  return 1;
}

RunStatus status_from_code(int code) {
  switch (code) {
    case 3:
      return RunStatus::kFinished;
    case 4:
      return RunStatus::kFailed;
    case 5:
      return RunStatus::kKilled;
    default:
      return RunStatus::kRunning;
  }
}

[[noreturn]] void fail(const std::string& what, const fs::path& path, int error) {
  throw StoreError("tracking: cannot " + what + " " + path.string() + ": " + std::strerror(error) +
                       "; check that the folder is writable, or set SGPU_TRACKING=off",
                   false);
}

// A YAML scalar: plain where YAML reads it back as the same string, else single-quoted.
std::string yaml_string(const std::string& value) {
  bool plain = !value.empty();
  for (char c : value) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '/' ||
          c == '.')) {
      plain = false;
    }
  }
  if (plain) {
    // Numbers, booleans and nulls would read back as something else.
    const bool numeric = value.find_first_not_of("0123456789.-+eE_") == std::string::npos;
    static const char* const kReserved[] = {"true", "false", "yes",   "no",   "on",   "off",
                                            "null", "True",  "False", "Null", "NULL", "~"};
    for (const char* word : kReserved) plain = plain && value != word;
    plain = plain && !numeric && value.front() != '-' && value.front() != '.';
  }
  if (plain) return value;
  std::string quoted = "'";
  for (char c : value) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}

// The value of `key:` in a flat meta.yaml, unquoted.
std::string yaml_field(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::string value = line.substr(prefix.size());
    value.erase(0, value.find_first_not_of(' '));
    if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
      std::string out;
      for (std::size_t i = 1; i + 1 < value.size(); ++i) {
        out += value[i];
        if (value[i] == '\'' && value[i + 1] == '\'') ++i;
      }
      return out;
    }
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      std::string out;
      for (std::size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size()) ++i;
        out += value[i];
      }
      return out;
    }
    return value;
  }
  return "";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("create the folder", dir, ec.value());
}

// An flock on a folder, held for its scope.
class FolderLock {
 public:
  explicit FolderLock(const fs::path& dir)
      : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) fail("open", dir, errno);
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

std::string file_uri(const fs::path& path) { return "file://" + path.string(); }

std::string experiment_meta(const std::string& id, const std::string& name,
                            const fs::path& location, std::int64_t now) {
  // The fields and order yaml.safe_dump gives MLflow 3's Experiment dict.
  return "artifact_location: " + yaml_string(file_uri(location)) +
         "\ncreation_time: " + std::to_string(now) +
         "\neffective_trace_archival_retention: null\nexperiment_id: '" + id +
         "'\nlast_update_time: " + std::to_string(now) +
         "\nlifecycle_stage: active\nname: " + yaml_string(name) +
         "\ntrace_location: null\nworkspace: default\n";
}

// Python's str(float): "1.5", "3.0", "nan", "inf", "-inf", "1e+300".
std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[64];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  std::string out(text, end);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

// A reader sees the old file or the new one whole (contract/atomic_file.h).
void replace_file(const fs::path& path, const std::string& content) {
  try {
    contract::write_file_atomically(path, content);
  } catch (const std::system_error& e) {
    fail("write", path, e.code().value());
  }
}

}  // namespace

fs::path file_store_root(const std::string& uri) {
  std::string path = uri;
  if (path.rfind("file://", 0) == 0) {
    path = path.substr(7);
  } else if (path.rfind("file:", 0) == 0) {
    path = path.substr(5);
  }
  if (path.empty()) path = "mlruns";
  return fs::absolute(path).lexically_normal();
}

FileStore::FileStore(fs::path root) : root_(std::move(root)) {
  if (fs::exists(root_ / "0" / "meta.yaml") && fs::exists(root_ / ".trash")) return;
  make_dirs(root_);
  FolderLock lock(root_);
  if (!fs::exists(root_ / "0" / "meta.yaml")) {
    make_dirs(root_ / "0");
    replace_file(root_ / "0" / "meta.yaml", experiment_meta("0", "Default", root_ / "0", now_ms()));
  }
  make_dirs(root_ / ".trash");
}

std::string FileStore::experiment_by_name(const std::string& name) {
  auto find = [&](const fs::path& parent) -> std::optional<std::string> {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(parent, ec)) {
      if (!entry.is_directory() || entry.path().filename() == ".trash") continue;
      const std::string meta = read_file(entry.path() / "meta.yaml");
      if (!meta.empty() && yaml_field(meta, "name") == name) {
        return yaml_field(meta, "experiment_id");
      }
    }
    return std::nullopt;
  };
  if (auto id = find(root_)) return *id;
  FolderLock lock(root_);
  if (auto id = find(root_)) return *id;
  if (find(root_ / ".trash")) {
    throw StoreError("tracking: experiment '" + name + "' is deleted (in " +
                         (root_ / ".trash").string() +
                         "); restore it, or choose another MLFLOW_EXPERIMENT_NAME",
                     false);
  }
  const std::string id = random_experiment_id();
  make_dirs(root_ / id);
  replace_file(root_ / id / "meta.yaml", experiment_meta(id, name, root_ / id, now_ms()));
  return id;
}

void FileStore::check_experiment(const std::string& id) {
  if (id.find('/') != std::string::npos || !fs::exists(root_ / id / "meta.yaml")) {
    throw StoreError("tracking: no experiment with id " + id + " in " + root_.string() +
                         "; check MLFLOW_EXPERIMENT_ID, or name one with MLFLOW_EXPERIMENT_NAME",
                     false);
  }
}

RunInfo FileStore::create_run(const std::string& experiment_id, const std::string& run_name,
                              std::int64_t start_time_ms, const std::vector<Tag>& tags) {
  check_experiment(experiment_id);
  RunInfo run;
  run.experiment_id = experiment_id;
  run.run_id = random_hex(32);
  run.run_name = run_name;
  run.start_time_ms = start_time_ms;
  const fs::path dir = root_ / experiment_id / run.run_id;
  run.artifact_uri = file_uri(dir / "artifacts");
  make_dirs(dir);
  // The fields and order of MLflow's _make_persisted_run_info_dict through yaml.safe_dump.
  const std::string meta = "artifact_uri: " + yaml_string(run.artifact_uri) +
                           "\ndeleted_time: null\nend_time: null\nentry_point_name: ''"
                           "\nexperiment_id: '" +
                           experiment_id + "'\nlifecycle_stage: active\nrun_id: " + run.run_id +
                           "\nrun_name: " + yaml_string(run_name) +
                           "\nsource_name: ''\nsource_type: 4\nsource_version: ''"
                           "\nstart_time: " +
                           std::to_string(start_time_ms) +
                           "\nstatus: 1\ntags: []\nuser_id: " + yaml_string(current_user()) + "\n";
  replace_file(dir / "meta.yaml", meta);
  for (const char* sub : {"metrics", "params", "artifacts", "tags"}) make_dirs(dir / sub);
  Batch initial;
  initial.tags = tags;
  initial.tags.push_back({"mlflow.runName", run_name});
  {
    std::lock_guard lock(mutex_);
    run_dirs_[run.run_id] = dir;
  }
  log_batch(run.run_id, initial);
  return run;
}

fs::path FileStore::run_dir(const std::string& run_id) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = run_dirs_.find(run_id); it != run_dirs_.end()) return it->second;
  }
  if (run_id.empty() || run_id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw StoreError("tracking: '" + run_id + "' is not a run id", false);
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    if (!entry.is_directory() || entry.path().filename() == ".trash") continue;
    const fs::path dir = entry.path() / run_id;
    if (fs::exists(dir / "meta.yaml")) {
      std::lock_guard lock(mutex_);
      run_dirs_[run_id] = dir;
      return dir;
    }
  }
  throw StoreError("tracking: no run " + run_id + " in " + root_.string(), false);
}

void FileStore::log_batch(const std::string& run_id, const Batch& batch) {
  const fs::path dir = run_dir(run_id);
  std::string refused;
  auto refuse = [&](const std::string& what) { refused += (refused.empty() ? "" : "; ") + what; };

  // One write per key: the lines of a key reach the file together and whole.
  std::map<std::string, std::string> lines;
  for (const Metric& metric : batch.metrics) {
    lines[metric.key] += std::to_string(metric.timestamp_ms) + " " + python_float(metric.value) +
                         " " + std::to_string(metric.step) + "\n";
  }
  for (const auto& [key, text] : lines) {
    const fs::path path = dir / "metrics" / key;
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      refuse("metric '" + key + "': " + std::strerror(errno));
      continue;
    }
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n != static_cast<ssize_t>(text.size())) {
      refuse("metric '" + key + "': " + (n < 0 ? std::strerror(errno) : "short write"));
    }
    ::close(fd);
  }
  for (const Param& param : batch.params) {
    const fs::path path = dir / "params" / param.key;
    if (fs::exists(path)) {
      const std::string current = read_file(path);
      if (current != param.value) {
        refuse("param '" + param.key + "' was already logged with value '" + current +
               "'; changing param values is not allowed (attempted '" + param.value + "')");
      }
      continue;
    }
    try {
      make_dirs(path.parent_path());
      replace_file(path, param.value);
    } catch (const StoreError& e) {
      refuse(e.what());
    }
  }
  for (const Tag& tag : batch.tags) {
    try {
      const fs::path path = dir / "tags" / tag.key;
      make_dirs(path.parent_path());
      replace_file(path, tag.value);
    } catch (const StoreError& e) {
      refuse(e.what());
    }
  }
  if (!refused.empty()) {
    throw StoreError("tracking: run " + run_id + " refused: " + refused, false);
  }
}

void FileStore::end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) {
  const fs::path meta_path = run_dir(run_id) / "meta.yaml";
  std::istringstream lines(read_file(meta_path));
  std::string line, meta;
  while (std::getline(lines, line)) {
    if (line.rfind("status:", 0) == 0) line = "status: " + std::to_string(status_code(status));
    if (line.rfind("end_time:", 0) == 0) line = "end_time: " + std::to_string(end_time_ms);
    meta += line + "\n";
  }
  replace_file(meta_path, meta);
}

RunInfo FileStore::get_run(const std::string& run_id) {
  const fs::path dir = run_dir(run_id);
  const std::string meta = read_file(dir / "meta.yaml");
  RunInfo run;
  run.run_id = run_id;
  run.experiment_id = yaml_field(meta, "experiment_id");
  run.run_name = yaml_field(meta, "run_name");
  run.artifact_uri = yaml_field(meta, "artifact_uri");
  run.status = status_from_code(std::atoi(yaml_field(meta, "status").c_str()));
  run.start_time_ms = std::atoll(yaml_field(meta, "start_time").c_str());
  run.end_time_ms = std::atoll(yaml_field(meta, "end_time").c_str());
  return run;
}

std::string FileStore::run_link(const RunInfo& run) const {
  return (root_ / run.experiment_id / run.run_id).string();
}

std::string FileStore::uri() const { return file_uri(root_); }

}  // namespace sgpu::tracking
