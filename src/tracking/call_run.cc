#include "tracking/call_run.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "contract/host_name.h"
#include "contract/rank_env.h"
#include "sgpu/config.h"
#include "sgpu/errors.h"
#include "tracking/active_run.h"
#include "tracking/pending.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

using contract::env_string;
using contract::host_name;

std::string program_path() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : path.string();
}

std::string timeout_text(const std::optional<std::chrono::milliseconds>& timeout) {
  if (!timeout) return "none";
  return std::to_string(timeout->count()) + "ms";
}

// Where else a call's run can go, as its caller names the settings.
std::string elsewhere_advice(FrontEnd front_end) {
  switch (front_end) {
    case FrontEnd::kPython:
      return "record the call elsewhere (tracking_uri=\"sqlite:////path/mlflow.db\" or "
             "MLFLOW_TRACKING_URI), or not at all (tracking=False, or SGPU_TRACKING=off)";
    case FrontEnd::kCommand:
      return "record the launch elsewhere (MLFLOW_TRACKING_URI=sqlite:////path/mlflow.db), or "
             "not at all (--no-tracking)";
    case FrontEnd::kCpp:
      break;
  }
  return "record the call elsewhere (Options::tracking_uri or MLFLOW_TRACKING_URI), or not at "
         "all (Options::tracking = false, or SGPU_TRACKING=off)";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> untracked_rank_environment() {
  return {{"SGPU_TRACKING", "off"}};
}

CallRun::CallRun(std::unique_ptr<Store> store, RunInfo info)
    : store_(std::move(store)), info_(std::move(info)) {}

std::optional<OpenedRun> open_run(const std::string& uri_option,
                                  const std::string& experiment_option, const std::string& run_name,
                                  std::vector<Tag> tags, const Batch& params,
                                  const std::string& parent_run_id, FrontEnd front_end) {
  const std::optional<ActiveRun> scope = innermost_active_run();
  const std::string uri = !uri_option.empty() ? uri_option
                          : scope             ? scope->uri
                                              : tracking_uri_from_environment();
  std::unique_ptr<Store> store;
  try {
    store = open_store(uri);  // a bad scheme is the user's to fix
  } catch (const StoreUnopened& e) {
    throw StoreError(std::string(e.what()) + ", or " + elsewhere_advice(front_end), false);
  }
  std::string parent;
  std::string parent_experiment;
  if (!parent_run_id.empty()) {
    parent = parent_run_id;
  } else if (scope) {
    parent = scope->run_id;
    parent_experiment = scope->experiment_id;
  } else if (std::string id = env_string("MLFLOW_RUN_ID"); !id.empty()) {
    parent = id;
  }
  try {
    std::string experiment_id;
    if (!experiment_option.empty()) {
      experiment_id = store->experiment_by_name(experiment_option);
    } else if (std::string name = env_string("MLFLOW_EXPERIMENT_NAME"); !name.empty()) {
      experiment_id = store->experiment_by_name(name);
    } else if (std::string id = env_string("MLFLOW_EXPERIMENT_ID"); !id.empty()) {
      store->check_experiment(id);
      experiment_id = id;
    } else if (!parent.empty()) {
      experiment_id =
          !parent_experiment.empty() ? parent_experiment : store->get_run(parent).experiment_id;
    } else {
      experiment_id = store->experiment_by_name("Default");
    }
    std::vector<Tag> all_tags = {
        {"mlflow.user", current_user()}, {"mlflow.source.name", program_path()},
        {"mlflow.source.type", "LOCAL"}, {"sgpu.version", SGPU_VERSION},
        {"sgpu.host", host_name()},
    };
    for (Tag& tag : tags) {  // a standard tag given here is replaced, never doubled
      auto same = std::find_if(all_tags.begin(), all_tags.end(),
                               [&](const Tag& standard) { return standard.key == tag.key; });
      if (same != all_tags.end()) {
        same->value = std::move(tag.value);
      } else {
        all_tags.push_back(std::move(tag));
      }
    }
    if (!parent.empty()) all_tags.push_back({"mlflow.parentRunId", parent});
    RunInfo info = store->create_run(experiment_id, truncate_value(run_name, kMaxKeyLength),
                                     now_ms(), all_tags);
    if (!params.empty()) store->log_batch(info.run_id, params);
    std::cerr << "sgpu: tracking run " << info.run_id << ": " << store->run_link(info) << std::endl;
    return OpenedRun{std::move(store), std::move(info)};
  } catch (const StoreError& e) {
    if (!e.transient()) throw;
    std::cerr << "sgpu: " << e.what()
              << "; this call runs untracked: it has no run, and the metrics and params its "
                 "ranks log are not kept, so `sgpu tracking sync` has nothing of it to send "
                 "later. To keep them, start the server before the call, or point tracking_uri "
                 "(MLFLOW_TRACKING_URI) at a store that is up, such as sqlite:///mlflow.db"
              << std::endl;
    return std::nullopt;
  }
}

std::unique_ptr<CallRun> CallRun::begin(const CallRunRequest& request) {
  if (!request.tracking || !tracking_enabled_by_environment(request.front_end)) return nullptr;
  std::vector<Tag> tags;
  if (!request.sim_node.empty()) tags.push_back({"sgpu.sim_node", request.sim_node});
  if (!request.source_name.empty()) tags.push_back({"mlflow.source.name", request.source_name});
  Batch params;
  params.params = {
      {"gpus", std::to_string(request.gpus)},
      {"gpu_type", request.gpu_type},
      {"backend", request.backend},
      {"world_size", std::to_string(request.gpus * std::max(request.nnodes, 1))},
      {"timeout", timeout_text(request.timeout)},
      {request.program ? "command" : "function",
       truncate_value(request.function_name, kMaxParamValueLength)},
  };
  if (request.nnodes > 1) params.params.push_back({"nnodes", std::to_string(request.nnodes)});
  std::optional<OpenedRun> opened =
      open_run(request.tracking_uri, request.experiment,
               !request.run_name.empty()       ? request.run_name
               : request.function_name.empty() ? "sgpu call"
                                               : request.function_name,
               tags, params, request.parent_run_id, request.front_end);
  if (!opened) return nullptr;
  return std::unique_ptr<CallRun>(new CallRun(std::move(opened->store), std::move(opened->info)));
}

CallRun::Shared CallRun::shared() const {
  return {store_->uri(), info_.experiment_id, info_.run_id};
}

std::unique_ptr<CallRun> CallRun::join(bool tracking, const Shared& run, FrontEnd front_end) {
  if (!tracking || !tracking_enabled_by_environment(front_end) || run.run_id.empty()) {
    return nullptr;
  }
  try {
    std::unique_ptr<Store> store = open_store(run.uri);
    RunInfo info = store->get_run(run.run_id);
    std::unique_ptr<CallRun> joined(new CallRun(std::move(store), std::move(info)));
    joined->joined_ = true;
    return joined;
  } catch (const std::exception& e) {
    std::cerr << "sgpu: tracking: this node cannot reach node 0's run " << run.run_id << " in "
              << run.uri << " (" << e.what()
              << "); what this node's ranks log is not recorded. Give every node a tracking "
                 "URI they all reach: a tracking server, or a store on a shared filesystem"
              << std::endl;
    return nullptr;
  }
}

std::vector<std::pair<std::string, std::string>> CallRun::rank_environment() const {
  std::vector<std::pair<std::string, std::string>> environment = {
      {"MLFLOW_RUN_ID", info_.run_id},
      {"MLFLOW_TRACKING_URI", store_->uri()},
      {"MLFLOW_EXPERIMENT_ID", info_.experiment_id},
      {kRankRunIdVar, info_.run_id},
      {kRankTrackingUriVar, store_->uri()},
      {"SGPU_TRACKING", "on"}};
  for (auto& entry : store_->client_environment()) environment.push_back(std::move(entry));
  return environment;
}

void CallRun::hold_in_flight(const std::filesystem::path& run_dir) {
  if (joined_) return;
  try {
    in_flight_ = std::make_unique<InFlightRecord>(run_dir, store_->uri(), info_.run_id);
  } catch (const TrackingError& e) {
    std::cerr << "sgpu: " << e.what() << "; should this process be killed outright, run "
              << info_.run_id << " stays RUNNING" << std::endl;
  }
}

std::string CallRun::link() const { return store_->run_link(info_); }

bool CallRun::end(RunStatus status, const std::filesystem::path& run_dir,
                  bool folder_kept_for_tracking_only) {
  const std::int64_t end_time = now_ms();
  SpoolSend sent;
  if (!run_dir.empty()) sent = send_spools(*store_, run_dir);
  if (joined_) {
    if (!sent.complete) {
      std::cerr << "sgpu: tracking: " << sent.error << "; what this node's ranks logged into run "
                << info_.run_id << " and could not send is kept in " << run_dir.string()
                << std::endl;
    }
    return sent.complete;
  }
  std::string last_error = sent.error;
  bool ended = false;
  if (sent.complete) {
    try {
      store_->end_run(info_.run_id, status, end_time);
      ended = true;
    } catch (const StoreError& e) {
      last_error = e.what();
    }
  }
  // The in-flight record goes (ended), or becomes the pending one, before its lock does.
  const std::unique_ptr<InFlightRecord> in_flight = std::move(in_flight_);
  if (ended && in_flight) in_flight->remove();
  const std::filesystem::path folder =
      !run_dir.empty() || !in_flight ? run_dir : in_flight->run_dir();
  if (!ended) {
    std::string kept = "nothing could be kept (the call has no run folder)";
    if (!folder.empty()) {
      try {
        write_pending(folder, {store_->uri(), info_.run_id, status, end_time,
                               folder_kept_for_tracking_only && folder == run_dir});
        kept = "what is left is kept in " + folder.string() +
               "; `sgpu tracking sync` sends it and ends the run (so does the next call that "
               "ends its run in this store)";
      } catch (const TrackingError& e) {
        kept = e.what();
      }
    }
    std::cerr << "sgpu: " << last_error << "; run " << info_.run_id << " is not ended: " << kept
              << std::endl;
    return false;
  }
  if (sent.entries > 0) {
    std::cerr << "sgpu: tracking: the store did not take everything during the call "
                 "(unreachable or too slow); the "
              << sent.entries << " entries the ranks kept were sent when it ended" << std::endl;
  }
  // Earlier calls that ended while this store was unreachable: the store is reachable now.
  if (!run_dir.empty()) {
    try {
      for (const SyncedRun& synced : sync_pending_runs(run_dir.parent_path(), store_->uri())) {
        std::cerr << "sgpu: tracking: " << describe(synced) << std::endl;
      }
    } catch (const std::exception& e) {  // never the call's failure
      std::cerr << "sgpu: tracking: runs left pending by earlier calls were not sent: " << e.what()
                << std::endl;
    }
  }
  return true;
}

}  // namespace sgpu::tracking
