#include "tracking/store.h"

#include <cstdlib>
#include <filesystem>

#include "contract/option_table.h"
#include "sgpu/config.h"
#include "sgpu/errors.h"
#include "tracking/file/file_store.h"
#include "tracking/sqlite/sqlite_store.h"
#if SGPU_WITH_TRACKING_SERVER
#include "tracking/rest/rest_store.h"
#endif

namespace sgpu::tracking {

std::unique_ptr<Store> open_store(const std::string& uri, const RetryPolicy& server_retry) {
  if (uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0) {
#if SGPU_WITH_TRACKING_SERVER
    return std::make_unique<RestStore>(uri, server_retry);
#else
    throw TrackingError(
        "tracking: this sgpu was built without libcurl, so it cannot reach the MLflow server "
        "at the tracking URI; install libcurl's headers (libcurl4-openssl-dev) and rebuild, "
        "or use MLflow's file store (MLFLOW_TRACKING_URI=file:/path), or SGPU_TRACKING=off");
#endif
  }
  if (uri.rfind("sqlite:", 0) == 0) return std::make_unique<SqliteStore>(uri);
  if (uri.empty() || uri.rfind("file:", 0) == 0 || uri.find("://") == std::string::npos) {
    return std::make_unique<FileStore>(file_store_root(uri));
  }
  throw TrackingError("tracking: unsupported tracking URI scheme in '" +
                      uri.substr(0, uri.find("://")) +
                      "://...': sgpu writes to an MLflow server (http:// or https://), to an "
                      "MLflow database (sqlite:///path) or to MLflow's file store (file: or a "
                      "path); set MLFLOW_TRACKING_URI to one of those, or SGPU_TRACKING=off");
}

bool has_mlruns_data(const std::filesystem::path& folder) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos &&
        entry.is_directory(ec) && std::filesystem::exists(entry.path() / "meta.yaml", ec)) {
      return true;
    }
  }
  return false;
}

std::string default_tracking_uri() {
  return has_mlruns_data("mlruns") ? std::string() : std::string(kDefaultDatabaseUri);
}

std::string tracking_uri_from_environment() {
  const char* uri = std::getenv("MLFLOW_TRACKING_URI");
  return uri != nullptr && *uri != '\0' ? uri : default_tracking_uri();
}

bool tracking_enabled_by_environment(FrontEnd front_end) {
  return contract::environment_flag("tracking", true, front_end);
}

}  // namespace sgpu::tracking
