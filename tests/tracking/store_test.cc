// The tracking core without a server: MLflow's key rules and limits, request building
// and splitting, the file store's layout and its appends from many processes, the spool,
// and the buffered logger.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rapidcheck/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "support/temp_dir.h"
#include "tracking/file/file_store.h"
#include "tracking/rest/rest_store.h"
#include "tracking/run_logger.h"
#include "tracking/spool.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;

fs::path temp_root() { return sgpu::testing::make_temp_dir("sgpu-store-test") / "mlruns"; }

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

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

RC_GTEST_PROP(SplitBatch, PiecesAreWithinMlflowsLimitsAndKeepEverythingInOrder,
              (std::uint16_t metrics, std::uint8_t params, std::uint8_t tags)) {
  Batch batch;
  for (int i = 0; i < metrics % 3500; ++i) batch.metrics.push_back({"m", double(i), i, i});
  for (int i = 0; i < params; ++i) batch.params.push_back({"p" + std::to_string(i), "v"});
  for (int i = 0; i < tags; ++i) batch.tags.push_back({"t" + std::to_string(i), "v"});
  Batch joined;
  for (const Batch& piece : split_batch(batch)) {
    RC_ASSERT(!piece.empty());
    RC_ASSERT(piece.metrics.size() <= kMaxMetricsPerBatch);
    RC_ASSERT(piece.params.size() <= kMaxParamsTagsPerBatch);
    RC_ASSERT(piece.tags.size() <= kMaxParamsTagsPerBatch);
    RC_ASSERT(piece.size() <= kMaxEntitiesPerBatch);
    joined.metrics.insert(joined.metrics.end(), piece.metrics.begin(), piece.metrics.end());
    joined.params.insert(joined.params.end(), piece.params.begin(), piece.params.end());
    joined.tags.insert(joined.tags.end(), piece.tags.begin(), piece.tags.end());
  }
  RC_ASSERT(joined.metrics.size() == batch.metrics.size());
  for (std::size_t i = 0; i < joined.metrics.size(); ++i)
    RC_ASSERT(joined.metrics[i].step == std::int64_t(i));
  RC_ASSERT(joined.params.size() == batch.params.size());
  RC_ASSERT(joined.tags.size() == batch.tags.size());
}

TEST(LogBatchBody, SpellsNonFiniteValuesAsProtobufJsonAndKeepsInt64Exact) {
  Batch batch;
  const double inf = std::numeric_limits<double>::infinity();
  batch.metrics = {{"a", std::nan(""), 9007199254740993, -3},
                   {"b", inf, 1, 0},
                   {"c", -inf, 1, 0},
                   {"d", 0.1, 1, 0}};
  batch.params = {{"p", "v"}};
  const auto body = nlohmann::json::parse(log_batch_body("r1", batch));
  EXPECT_EQ(body["run_id"], "r1");
  EXPECT_EQ(body["metrics"][0]["value"], "NaN");
  EXPECT_EQ(body["metrics"][0]["timestamp"].get<std::int64_t>(), 9007199254740993);
  EXPECT_EQ(body["metrics"][0]["step"].get<std::int64_t>(), -3);
  EXPECT_EQ(body["metrics"][1]["value"], "Infinity");
  EXPECT_EQ(body["metrics"][2]["value"], "-Infinity");
  EXPECT_EQ(body["metrics"][3]["value"].get<double>(), 0.1);
  EXPECT_EQ(body["params"][0]["key"], "p");
  EXPECT_FALSE(body.contains("tags"));
}

TEST(FileStore, WritesMlflowsLayout) {
  const fs::path root = temp_root();
  FileStore store(root);
  EXPECT_TRUE(fs::is_directory(root / ".trash"));
  EXPECT_NE(read(root / "0" / "meta.yaml").find("name: Default"), std::string::npos);
  const std::string experiment = store.experiment_by_name("my experiment");
  EXPECT_EQ(experiment.size(), 18u);
  EXPECT_EQ(store.experiment_by_name("my experiment"), experiment);  // found, not created again
  EXPECT_NE(read(root / experiment / "meta.yaml").find("name: 'my experiment'"), std::string::npos);

  const RunInfo run = store.create_run(experiment, "train(int)", 1700000000000, {{"k", "v"}});
  const fs::path dir = root / experiment / run.run_id;
  EXPECT_EQ(run.run_id.size(), 32u);
  for (const char* sub : {"metrics", "params", "tags", "artifacts"}) {
    EXPECT_TRUE(fs::is_directory(dir / sub)) << sub;
  }
  EXPECT_EQ(read(dir / "tags" / "k"), "v");
  EXPECT_EQ(read(dir / "tags" / "mlflow.runName"), "train(int)");
  const std::string meta = read(dir / "meta.yaml");
  EXPECT_NE(meta.find("status: 1\n"), std::string::npos) << meta;
  EXPECT_NE(meta.find("start_time: 1700000000000\n"), std::string::npos) << meta;

  Batch batch;
  batch.metrics = {
      {"train/loss", 1.5, 10, 0}, {"train/loss", 2.0, 11, 1}, {"nan", std::nan(""), 12, 2}};
  batch.params = {{"lr", "0.1"}};
  store.log_batch(run.run_id, batch);
  EXPECT_EQ(lines_of(dir / "metrics" / "train" / "loss"),
            (std::vector<std::string>{"10 1.5 0", "11 2.0 1"}));
  EXPECT_EQ(lines_of(dir / "metrics" / "nan"), std::vector<std::string>{"12 nan 2"});
  EXPECT_EQ(read(dir / "params" / "lr"), "0.1");

  store.end_run(run.run_id, RunStatus::kKilled, 1700000001000);
  EXPECT_EQ(store.get_run(run.run_id).status, RunStatus::kKilled);
  EXPECT_EQ(store.get_run(run.run_id).end_time_ms, 1700000001000);
  EXPECT_EQ(store.run_link(run), dir.string());
}

TEST(FileStore, ARefusedParamDoesNotDropItsNeighbours) {
  FileStore store(temp_root());
  const RunInfo run = store.create_run("0", "r", 1, {});
  store.log_batch(run.run_id, Batch{{}, {{"lr", "0.1"}}, {}});
  Batch batch;
  batch.params = {{"lr", "0.2"}, {"momentum", "0.9"}};
  batch.metrics = {{"loss", 1, 1, 1}};
  try {
    store.log_batch(run.run_id, batch);
    FAIL() << "a changed param was accepted";
  } catch (const StoreError& e) {
    EXPECT_FALSE(e.transient());
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos);
  }
  const fs::path dir = store.root() / "0" / run.run_id;
  EXPECT_EQ(read(dir / "params" / "lr"), "0.1");
  EXPECT_EQ(read(dir / "params" / "momentum"), "0.9");
  EXPECT_EQ(lines_of(dir / "metrics" / "loss").size(), 1u);
}

TEST(FileStore, AppendsFromEightProcessesNeverInterleaveWithinALine) {
  const fs::path root = temp_root();
  std::string run_id;
  {
    FileStore store(root);
    run_id = store.create_run("0", "r", 1, {}).run_id;
  }
  constexpr int kWriters = 8, kBatches = 50, kPerBatch = 40;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      FileStore store(root);
      for (int b = 0; b < kBatches; ++b) {
        Batch batch;
        for (int i = 0; i < kPerBatch; ++i) {
          const int step = b * kPerBatch + i;
          batch.metrics.push_back(
              {"shared/key", w * 1e6 + step + 0.123456789, 1700000000000 + w, step});
        }
        store.log_batch(run_id, batch);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::set<std::pair<int, int>> seen;
  for (const std::string& line : lines_of(root / "0" / run_id / "metrics" / "shared" / "key")) {
    std::istringstream fields(line);
    long long stamp = 0, step = -1;
    double value = 0;
    std::string rest;
    ASSERT_TRUE(fields >> stamp >> value >> step) << line;
    ASSERT_FALSE(fields >> rest) << line;
    const int writer = static_cast<int>(stamp - 1700000000000);
    ASSERT_EQ(value, writer * 1e6 + step + 0.123456789) << line;
    seen.insert({writer, static_cast<int>(step)});
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kWriters * kBatches * kPerBatch));
}

TEST(Spool, RoundTripsBatchesWithNonFiniteValues) {
  const fs::path file = temp_root().parent_path() / "spool.jsonl";
  Batch batch;
  batch.metrics = {{"a", std::nan(""), 5, 6},
                   {"b", -std::numeric_limits<double>::infinity(), 7, 8}};
  batch.tags = {{"t", "v"}};
  spool_batch(file, "run1", batch);
  spool_batch(file, "run2", Batch{{{"c", 1.25, 1, 2}}, {}, {}});
  const auto spooled = read_spool(file);
  ASSERT_EQ(spooled.size(), 2u);
  EXPECT_EQ(spooled[0].run_id, "run1");
  EXPECT_TRUE(std::isnan(spooled[0].batch.metrics[0].value));
  EXPECT_EQ(spooled[0].batch.metrics[0].timestamp_ms, 5);
  EXPECT_EQ(spooled[0].batch.metrics[1].value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(spooled[0].batch.tags[0].value, "v");
  EXPECT_EQ(spooled[1].batch.metrics[0].value, 1.25);
}

TEST(RunLogger, TenThousandMetricsInOneFlushAllArriveAndABadKeyThrowsAtTheCall) {
  const fs::path root = temp_root();
  auto store = std::make_unique<FileStore>(root);
  const std::string run_id = store->create_run("0", "r", 1, {}).run_id;
  LoggerSettings settings;
  settings.run_id = run_id;
  settings.flush_interval = std::chrono::hours(1);  // only flush() sends
  RunLogger logger(std::move(store), settings);
  for (int step = 0; step < 10'000; ++step) logger.log_metric("loss", step * 0.5, step);
  EXPECT_THROW(logger.log_metric("bad key!", 1, 0), TrackingError);
  logger.log_param("long", std::string(7000, 'x'));
  EXPECT_TRUE(logger.flush());
  const fs::path dir = root / "0" / run_id;
  const auto lines = lines_of(dir / "metrics" / "loss");
  ASSERT_EQ(lines.size(), 10'000u);
  EXPECT_EQ(lines.back().substr(lines.back().find(' ')), " 4999.5 9999");
  EXPECT_EQ(read(dir / "params" / "long").size(), kMaxParamValueLength);
}

// A tiny HTTP responder: answers each request with the next canned response (status and
// body), records what it got, and closes the connection.
class Responder {
 public:
  explicit Responder(std::vector<std::pair<int, std::string>> answers)
      : answers_(std::move(answers)), fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(fd_, 16);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (const auto& [status, body] : answers_) {
        const int client = ::accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        std::string request;
        char buffer[65536];
        // Headers, then as much body as Content-Length says.
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::read(client, buffer, sizeof buffer);
          if (n <= 0) break;
          request.append(buffer, static_cast<std::size_t>(n));
        }
        const auto length_at = request.find("Content-Length: ");
        if (length_at != std::string::npos) {
          const std::size_t length = std::stoul(request.substr(length_at + 16));
          while (request.size() - request.find("\r\n\r\n") - 4 < length) {
            const ssize_t n = ::read(client, buffer, sizeof buffer);
            if (n <= 0) break;
            request.append(buffer, static_cast<std::size_t>(n));
          }
        }
        requests_.push_back(request);
        const std::string reply = "HTTP/1.1 " + std::to_string(status) +
                                  " X\r\nContent-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                  body;
        [[maybe_unused]] ssize_t w = ::write(client, reply.data(), reply.size());
        ::close(client);
      }
    });
  }
  ~Responder() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Valid once the responder answered them all.
  const std::vector<std::string>& requests() const { return requests_; }

 private:
  std::vector<std::pair<int, std::string>> answers_;
  int fd_;
  int port_ = 0;
  std::vector<std::string> requests_;
  std::thread thread_;
};

constexpr RetryPolicy kFastRetries{4, std::chrono::milliseconds(10), std::chrono::seconds(5),
                                   std::chrono::seconds(1)};

TEST(RestStore, RetriesTransientFailuresAndSendsTheBearerToken) {
  ::setenv("MLFLOW_TRACKING_TOKEN", "s3cret-token", 1);
  const std::string run = R"({"run": {"info": {"run_id": "abc", "experiment_id": "7",
      "status": "RUNNING", "start_time": "1700000000000", "end_time": 1700000000001}}})";
  {
    Responder server({{503, "{}"}, {429, "{}"}, {200, run}});
    RestStore store(server.uri(), kFastRetries);
    const RunInfo info = store.get_run("abc");
    EXPECT_EQ(info.run_id, "abc");
    EXPECT_EQ(info.experiment_id, "7");
    EXPECT_EQ(info.start_time_ms, 1700000000000);  // an int64 given as a string
    EXPECT_EQ(info.end_time_ms, 1700000000001);    // and as a number
    EXPECT_EQ(store.requests_sent(), 3u);
    EXPECT_EQ(store.run_link({"7", "abc"}), server.uri() + "/#/experiments/7/runs/abc");
    ASSERT_EQ(server.requests().size(), 3u);
    EXPECT_NE(server.requests()[2].find("Authorization: Bearer s3cret-token"), std::string::npos);
  }
  ::unsetenv("MLFLOW_TRACKING_TOKEN");
}

TEST(RestStore, CredentialsNeverAppearInErrors) {
  ::setenv("MLFLOW_TRACKING_USERNAME", "alice", 1);
  ::setenv("MLFLOW_TRACKING_PASSWORD", "pa55word", 1);
  Responder server({{401, R"({"error_code": "UNAUTHENTICATED", "message": "bad credentials"})"}});
  RestStore store(server.uri(), kFastRetries);
  try {
    store.get_run("abc");
    FAIL() << "a 401 was accepted";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_FALSE(e.transient());
    EXPECT_NE(what.find("MLFLOW_TRACKING_USERNAME"), std::string::npos) << what;
    EXPECT_EQ(what.find("pa55word"), std::string::npos) << what;
  }
  EXPECT_NE(server.requests().at(0).find("Authorization: Basic "), std::string::npos);
  ::unsetenv("MLFLOW_TRACKING_USERNAME");
  ::unsetenv("MLFLOW_TRACKING_PASSWORD");
  // Credentials in the URI are hidden too.
  RestStore unreachable("http://bob:hunter2@127.0.0.1:1", RetryPolicy{1});
  try {
    unreachable.get_run("abc");
  } catch (const StoreError& e) {
    EXPECT_TRUE(e.transient());
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

TEST(RestStore, ARefusedBatchIsSentAgainEntryByEntrySoNeighboursArrive) {
  const std::string refused = R"({"error_code": "INVALID_PARAMETER_VALUE", "message": "no"})";
  // The batch of three is refused; then "a" is taken, "b" refused, "c" taken.
  Responder server({{400, refused}, {200, "{}"}, {400, refused}, {200, "{}"}});
  RestStore store(server.uri(), kFastRetries);
  Batch batch;
  batch.params = {{"a", "1"}, {"b", "2"}, {"c", "3"}};
  try {
    store.log_batch("run", batch);
    FAIL() << "the refusal was not reported";
  } catch (const StoreError& e) {
    EXPECT_FALSE(e.transient());
    EXPECT_NE(std::string(e.what()).find("param 'b'"), std::string::npos) << e.what();
  }
  ASSERT_EQ(server.requests().size(), 4u);
  EXPECT_NE(server.requests()[3].find(R"("key":"c")"), std::string::npos);
}

}  // namespace
}  // namespace sgpu::tracking
