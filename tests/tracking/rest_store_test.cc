// The MLflow REST store against a canned responder on 127.0.0.1: retries, the bearer
// token, credentials kept out of errors, a refused batch sent again entry by entry;
// without libcurl, what an http URI says.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "sgpu/config.h"
#include "sgpu/errors.h"
#include "tracking/run_model.h"
#include "tracking/store.h"
#include "tracking/store_support.h"
#if SGPU_WITH_TRACKING_SERVER
#include "tracking/rest/rest_store.h"
#endif

namespace sgpu::tracking {
namespace {

#if SGPU_WITH_TRACKING_SERVER
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
    FAIL() << "a server on port 1 answered";
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
#else
TEST(RestStore, AnHttpUriSaysThisBuildHasNoServerStore) {
  try {
    open_store("http://127.0.0.1:1");
    FAIL() << "an http URI was accepted";
  } catch (const TrackingError& e) {
    EXPECT_NE(std::string(e.what()).find("built without libcurl"), std::string::npos) << e.what();
  }
}
#endif  // SGPU_WITH_TRACKING_SERVER

}  // namespace
}  // namespace sgpu::tracking
