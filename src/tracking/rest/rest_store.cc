#include "tracking/rest/rest_store.h"

#include <curl/curl.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "tracking/log_batch.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

using nlohmann::json;

bool env_true(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  const std::string v(value);
  return v == "true" || v == "True" || v == "TRUE" || v == "1";
}

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The URI with any user:password@ taken out, for messages.
std::string redacted(const std::string& uri) {
  const auto scheme = uri.find("://");
  if (scheme == std::string::npos) return uri;
  const auto host_end = uri.find('/', scheme + 3);
  const auto at = uri.rfind('@', host_end);
  if (at == std::string::npos || at < scheme) return uri;
  return uri.substr(0, scheme + 3) + "***@" + uri.substr(at + 1);
}

// An int64 field that protobuf JSON may give as a number or a string.
std::int64_t int64_field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number()) return it->get<std::int64_t>();
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return 0;
}

std::string string_field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

RunInfo run_info_from(const json& response) {
  const json& info = response.at("run").at("info");
  RunInfo run;
  run.run_id = string_field(info, "run_id");
  if (run.run_id.empty()) run.run_id = string_field(info, "run_uuid");
  run.experiment_id = string_field(info, "experiment_id");
  run.run_name = string_field(info, "run_name");
  run.status = status_from_name(string_field(info, "status"));
  run.start_time_ms = int64_field(info, "start_time");
  run.end_time_ms = int64_field(info, "end_time");
  run.artifact_uri = string_field(info, "artifact_uri");
  return run;
}

// What the server said, without echoing anything of the request.
std::string server_message(long status, const std::string& body) {
  std::string message = "HTTP " + std::to_string(status);
  const json parsed = json::parse(body, nullptr, false);
  if (parsed.is_object()) {
    const std::string code = string_field(parsed, "error_code");
    const std::string text = string_field(parsed, "message");
    if (!code.empty()) message += " " + code;
    if (!text.empty()) message += ": " + text.substr(0, 500);
  }
  return message;
}

std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

std::string escape_query(CURL* curl, const std::string& value) {
  char* escaped = curl_easy_escape(curl, value.c_str(), static_cast<int>(value.size()));
  std::string out = escaped != nullptr ? escaped : "";
  curl_free(escaped);
  return out;
}

}  // namespace

struct RestStore::Http {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  std::string userpwd;
  ~Http() {
    curl_slist_free_all(headers);
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

RestStore::RestStore(std::string uri, RetryPolicy policy)
    : uri_(uri.back() == '/' ? uri.substr(0, uri.size() - 1) : uri),
      policy_(policy),
      http_(std::make_unique<Http>()) {
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (global != CURLE_OK) throw StoreError("tracking: libcurl failed to initialise", false);
  http_->curl = curl_easy_init();
  if (http_->curl == nullptr) throw StoreError("tracking: libcurl failed to initialise", false);
  http_->headers = curl_slist_append(http_->headers, "Content-Type: application/json");
  if (const std::string token = env_or_empty("MLFLOW_TRACKING_TOKEN"); !token.empty()) {
    http_->headers = curl_slist_append(http_->headers, ("Authorization: Bearer " + token).c_str());
  } else if (const std::string user = env_or_empty("MLFLOW_TRACKING_USERNAME"); !user.empty()) {
    http_->userpwd = user + ":" + env_or_empty("MLFLOW_TRACKING_PASSWORD");
  }
}

RestStore::~RestStore() = default;

void RestStore::set_retry_policy(RetryPolicy policy) {
  std::lock_guard lock(mutex_);
  policy_ = policy;
}

std::size_t RestStore::requests_sent() const {
  std::lock_guard lock(mutex_);
  return requests_;
}

RestStore::Response RestStore::call_once(const char* method, const std::string& path,
                                         const std::string& body, std::string* transport_error) {
  CURL* curl = http_->curl;
  curl_easy_reset(curl);
  Response response;
  const std::string url = uri_ + "/api/2.0/mlflow/" + path;
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, http_->headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(policy_.request_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(policy_.connect_timeout.count()));
  if (!http_->userpwd.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERPWD, http_->userpwd.c_str());
  }
  if (env_true("MLFLOW_TRACKING_INSECURE_TLS")) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  } else if (const std::string ca = env_or_empty("MLFLOW_TRACKING_SERVER_CERT_PATH"); !ca.empty()) {
    curl_easy_setopt(curl, CURLOPT_CAINFO, ca.c_str());
  }
  if (std::string(method) == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    *transport_error = std::string(curl_easy_strerror(rc)) + (error[0] != 0 ? " (" : "") +
                       (error[0] != 0 ? std::string(error) + ")" : "");
    return response;
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

RestStore::Response RestStore::call(const char* method, const std::string& path,
                                    const std::string& body) {
  std::lock_guard lock(mutex_);
  auto backoff = policy_.first_backoff;
  std::string last;
  for (int attempt = 1;; ++attempt) {
    std::string transport_error;
    ++requests_;
    Response response = call_once(method, path, body, &transport_error);
    const bool transient =
        !transport_error.empty() || response.status == 429 || response.status >= 500;
    if (!transient) return response;
    last =
        transport_error.empty() ? server_message(response.status, response.body) : transport_error;
    if (attempt >= policy_.attempts) break;
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
  throw StoreError("tracking: the server at " + redacted(uri_) + " did not take " + path +
                       " after " + std::to_string(policy_.attempts) + " tries: " + last,
                   true);
}

namespace {

json parse_ok(const std::string& uri, const std::string& path, long status,
              const std::string& body) {
  if (status == 401 || status == 403) {
    throw StoreError("tracking: the server at " + uri + " refused " + path + " (" +
                         server_message(status, body) +
                         "); check MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD",
                     false);
  }
  if (status < 200 || status >= 300) {
    throw StoreError(
        "tracking: the server at " + uri + " refused " + path + ": " + server_message(status, body),
        false);
  }
  json parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded()) {
    throw StoreError("tracking: the server at " + uri + " answered " + path +
                         " with something that is not JSON; is MLFLOW_TRACKING_URI an MLflow "
                         "tracking server?",
                     false);
  }
  return parsed;
}

}  // namespace

std::string RestStore::experiment_by_name(const std::string& name) {
  const std::string query =
      "experiments/get-by-name?experiment_name=" + escape_query(http_->curl, name);
  for (int round = 0; round < 2; ++round) {
    Response found = call("GET", query, "");
    if (found.status == 200) {
      const json parsed =
          parse_ok(redacted(uri_), "experiments/get-by-name", found.status, found.body);
      return string_field(parsed.at("experiment"), "experiment_id");
    }
    if (found.status != 404) {
      parse_ok(redacted(uri_), "experiments/get-by-name", found.status, found.body);
    }
    Response created = call("POST", "experiments/create", json{{"name", name}}.dump());
    if (created.status == 200) {
      return string_field(
          parse_ok(redacted(uri_), "experiments/create", created.status, created.body),
          "experiment_id");
    }
    // Another caller created it between our two requests: look it up again.
    if (server_message(created.status, created.body).find("RESOURCE_ALREADY_EXISTS") ==
        std::string::npos) {
      parse_ok(redacted(uri_), "experiments/create", created.status, created.body);
    }
  }
  throw StoreError("tracking: cannot find or create experiment '" + name + "'", false);
}

void RestStore::check_experiment(const std::string& id) {
  Response r = call("GET", "experiments/get?experiment_id=" + escape_query(http_->curl, id), "");
  if (r.status == 404) {
    throw StoreError("tracking: the server at " + redacted(uri_) + " has no experiment " + id +
                         "; check MLFLOW_EXPERIMENT_ID",
                     false);
  }
  parse_ok(redacted(uri_), "experiments/get", r.status, r.body);
}

RunInfo RestStore::create_run(const std::string& experiment_id, const std::string& run_name,
                              std::int64_t start_time_ms, const std::vector<Tag>& tags) {
  json tag_list = json::array();
  for (const Tag& t : tags) tag_list.push_back({{"key", t.key}, {"value", t.value}});
  const char* user = std::getenv("LOGNAME");
  if (user == nullptr) user = std::getenv("USER");
  const json body = {{"experiment_id", experiment_id},
                     {"user_id", user != nullptr ? user : ""},
                     {"run_name", run_name},
                     {"start_time", start_time_ms},
                     {"tags", tag_list}};
  Response r =
      call("POST", "runs/create", body.dump(-1, ' ', false, json::error_handler_t::replace));
  return run_info_from(parse_ok(redacted(uri_), "runs/create", r.status, r.body));
}

void RestStore::send_batch(const std::string& run_id, const Batch& batch, std::string* refused) {
  Response r = call("POST", "runs/log-batch", log_batch_body(run_id, batch));
  if (r.status == 200) return;
  if (r.status == 400 && batch.size() > 1) {
    // One entry spoilt the request: the others go one by one.
    for (const Metric& m : batch.metrics) send_batch(run_id, Batch{{m}, {}, {}}, refused);
    for (const Param& p : batch.params) send_batch(run_id, Batch{{}, {p}, {}}, refused);
    for (const Tag& t : batch.tags) send_batch(run_id, Batch{{}, {}, {t}}, refused);
    return;
  }
  if (r.status == 400) {
    const std::string key = !batch.metrics.empty()  ? "metric '" + batch.metrics[0].key + "'"
                            : !batch.params.empty() ? "param '" + batch.params[0].key + "'"
                                                    : "tag '" + batch.tags[0].key + "'";
    *refused += (refused->empty() ? "" : "; ") + key + ": " + server_message(r.status, r.body);
    return;
  }
  parse_ok(redacted(uri_), "runs/log-batch", r.status, r.body);
}

void RestStore::log_batch(const std::string& run_id, const Batch& batch) {
  std::string refused;
  for (const Batch& piece : split_batch(batch)) send_batch(run_id, piece, &refused);
  if (!refused.empty()) {
    throw StoreError("tracking: the server refused for run " + run_id + ": " + refused, false);
  }
}

void RestStore::end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) {
  const json body = {
      {"run_id", run_id}, {"status", status_name(status)}, {"end_time", end_time_ms}};
  Response r = call("POST", "runs/update", body.dump());
  parse_ok(redacted(uri_), "runs/update", r.status, r.body);
}

RunInfo RestStore::get_run(const std::string& run_id) {
  Response r = call("GET", "runs/get?run_id=" + escape_query(http_->curl, run_id), "");
  return run_info_from(parse_ok(redacted(uri_), "runs/get", r.status, r.body));
}

std::string RestStore::run_link(const RunInfo& run) const {
  return redacted(uri_) + "/#/experiments/" + run.experiment_id + "/runs/" + run.run_id;
}

}  // namespace sgpu::tracking
