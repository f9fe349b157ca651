#include "sgpu/parallel/zero_config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "sgpu/errors.h"

namespace sgpu::parallel {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError("sgpu ZeRO config: '" + key + "' " + what);
}

void only_keys(const json& object, const std::string& where, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : object.items()) {
    if (!allowed.count(key)) {
      const std::string name = where.empty() ? key : where + "." + key;
      bad(
          name, "is not supported (understood here: " + [&] {
            std::string list;
            for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
            return list;
          }() + ")");
    }
  }
}

template <class T>
T get(const json& object, const std::string& key, const std::string& name) {
  try {
    return object.at(key).get<T>();
  } catch (const json::exception&) {
    bad(name, "has the wrong type: " + object.at(key).dump());
  }
}

double positive(double value, const std::string& name, bool zero_ok) {
  if (!std::isfinite(value) || value < 0 || (!zero_ok && value == 0)) {
    bad(name, "must be a " + std::string(zero_ok ? "non-negative" : "positive") + " number, not " +
                  json(value).dump());
  }
  return value;
}

void read_zero_optimization(const json& zero, ZeroConfig& config) {
  if (!zero.is_object()) bad("zero_optimization", "must be an object");
  only_keys(zero, "zero_optimization", {"stage"});
  if (!zero.contains("stage")) return;
  config.stage = get<int>(zero, "stage", "zero_optimization.stage");
  if (config.stage != 1 && config.stage != 2) {
    bad("zero_optimization.stage", "is " + std::to_string(config.stage) +
                                       "; stages 1 and 2 are supported (stage 3 is "
                                       "sgpu::parallel::FullyShardedDataParallel)");
  }
}

// optimizer.params, for the optimizer's type (already read).
void read_optimizer_params(const json& p, ZeroConfig& config) {
  if (!p.is_object()) bad("optimizer.params", "must be an object");
  const bool sgd = config.optimizer == "SGD";
  std::set<std::string> allowed{"lr", "weight_decay"};
  if (sgd) {
    allowed.insert({"momentum", "dampening", "nesterov"});
  } else {
    allowed.insert({"betas", "eps"});
    if (config.optimizer == "Adam") allowed.insert("adam_w_mode");
  }
  only_keys(p, "optimizer.params", allowed);
  // A number param: its value, checked positive (or non-negative where zero means off).
  const auto number = [&](const char* key, bool zero_ok) {
    const std::string name = std::string("optimizer.params.") + key;
    return positive(get<double>(p, key, name), name, zero_ok);
  };
  if (p.contains("lr")) config.lr = number("lr", false);
  if (p.contains("weight_decay")) config.weight_decay = number("weight_decay", true);
  if (p.contains("eps")) config.eps = number("eps", false);
  if (p.contains("betas")) {
    const auto betas = get<std::vector<double>>(p, "betas", "optimizer.params.betas");
    if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1) {
      bad("optimizer.params.betas", "must be two numbers in [0, 1), not " + p["betas"].dump());
    }
    config.betas = {betas[0], betas[1]};
  }
  if (p.contains("adam_w_mode")) {
    config.adam_w_mode = get<bool>(p, "adam_w_mode", "optimizer.params.adam_w_mode");
  }
  if (p.contains("momentum")) config.momentum = number("momentum", true);
  if (p.contains("dampening")) config.dampening = number("dampening", true);
  if (p.contains("nesterov"))
    config.nesterov = get<bool>(p, "nesterov", "optimizer.params.nesterov");
}

void read_optimizer(const json& opt, ZeroConfig& config) {
  if (!opt.is_object()) bad("optimizer", "must be an object");
  only_keys(opt, "optimizer", {"type", "params"});
  if (opt.contains("type")) {
    config.optimizer = get<std::string>(opt, "type", "optimizer.type");
    if (config.optimizer != "Adam" && config.optimizer != "AdamW" && config.optimizer != "SGD") {
      bad("optimizer.type", "is \"" + config.optimizer + "\"; supported: Adam, AdamW, SGD");
    }
  }
  if (opt.contains("params")) read_optimizer_params(opt["params"], config);
}

}  // namespace

ZeroConfig ZeroConfig::parse(const std::string& text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(std::string("sgpu ZeRO config: not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw ConfigError("sgpu ZeRO config: the config must be a JSON object");
  only_keys(root, "",
            {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "zero_optimization", "optimizer"});
  ZeroConfig config;
  if (root.contains("train_batch_size")) {
    config.train_batch_size = get<std::int64_t>(root, "train_batch_size", "train_batch_size");
    if (*config.train_batch_size <= 0) bad("train_batch_size", "must be positive");
  }
  if (root.contains("train_micro_batch_size_per_gpu")) {
    config.micro_batch_size =
        get<std::int64_t>(root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu");
    if (config.micro_batch_size <= 0) bad("train_micro_batch_size_per_gpu", "must be positive");
  }
  if (root.contains("gradient_accumulation_steps")) {
    config.gradient_accumulation_steps =
        get<std::int64_t>(root, "gradient_accumulation_steps", "gradient_accumulation_steps");
    if (config.gradient_accumulation_steps <= 0)
      bad("gradient_accumulation_steps", "must be positive");
  }
  if (root.contains("gradient_clipping")) {
    config.gradient_clipping = positive(get<double>(root, "gradient_clipping", "gradient_clipping"),
                                        "gradient_clipping", true);
  }
  if (root.contains("zero_optimization")) read_zero_optimization(root["zero_optimization"], config);
  if (root.contains("optimizer")) read_optimizer(root["optimizer"], config);
  return config;
}

}  // namespace sgpu::parallel
