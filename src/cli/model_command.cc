#include "cli/model_command.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/platform.h"
#include "sgpu/errors.h"

namespace sgpu::cli {
namespace {

using model::Collective;

constexpr int kUsageError = 2;

std::string size_text(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 30) && bytes % (std::int64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (std::int64_t{1} << 20) && bytes % (std::int64_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::vector<Collective> parse_ops(const std::vector<std::string>& names) {
  std::vector<Collective> ops;
  for (const std::string& name : names) {
    const auto c = model::parse_collective(name);
    if (!c) {
      throw ConfigError("--ops names \"" + name +
                        "\": give all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                        "all_to_all or send_recv");
    }
    ops.push_back(*c);
  }
  return ops;
}

struct ModelFlags {
  std::string predict_platform = "h100-nvswitch";
  std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter"};
  std::string min_bytes = "8", max_bytes = "8G";
  int ranks = 0;
  int nodes = 1;
  std::vector<std::string> validate_platforms;
  bool markdown = false;
  std::string bench_json, base = "auto", gpu_type, name, output;
};

int list() {
  for (const std::string& name : model::platform_names()) {
    const model::Platform p = model::load_platform(name);
    std::string types;
    for (const std::string& t : p.default_for) types += (types.empty() ? "" : ", ") + t;
    std::cout << name << "  " << p.description;
    if (!types.empty()) std::cout << " [the node of " << types << "]";
    std::cout << "\n    " << p.origin << "\n";
  }
  return 0;
}

int predict(const ModelFlags& flags) {
  const model::Platform p = model::load_platform(flags.predict_platform);
  const std::vector<Collective> ops = parse_ops(flags.ops);
  const std::int64_t min = model::parse_message_size(flags.min_bytes);
  const std::int64_t max = model::parse_message_size(flags.max_bytes);
  const int nodes = std::max(flags.nodes, 1);
  const int ranks = flags.ranks > 0 ? flags.ranks : (p.gpus > 0 ? p.gpus : 8) * nodes;
  if (ranks < nodes)
    throw ConfigError("--ranks " + std::to_string(ranks) + " cannot fill --nodes " +
                      std::to_string(nodes) + ": give at least one rank a node");
  const model::Span span{ranks, nodes, ranks / nodes};
  model::require_network(p, span);
  std::cout << "# " << p.name << ", " << ranks << " ranks"
            << (nodes > 1 ? " on " + std::to_string(nodes) + " nodes" : std::string())
            << ": the collective model's times (" << p.origin << ")\n";
  std::printf("# %-14s %14s %12s %10s %10s  %s\n", "op", "size (B)", "time (us)", "algbw", "busbw",
              "algorithm");
  for (Collective op : ops) {
    for (std::int64_t bytes = std::max<std::int64_t>(min, 1); bytes <= max; bytes *= 2) {
      const model::Prediction got = model::predict(p, op, bytes, span);
      const double algbw = got.seconds > 0 ? static_cast<double>(bytes) / got.seconds / 1e9 : 0;
      std::printf("  %-14s %14lld %12.2f %10.2f %10.2f  %s\n",
                  std::string(model::collective_name(op)).c_str(), static_cast<long long>(bytes),
                  got.seconds * 1e6, algbw, got.busbw_gbps, got.algorithm.c_str());
    }
  }
  return 0;
}

int validate(const ModelFlags& flags) {
  std::vector<std::string> names = flags.validate_platforms;
  if (names.empty()) names = model::platform_names();
  bool any = false;
  if (flags.markdown) {
    std::cout << "| platform | op | size | published | predicted | time error | source |\n"
              << "| --- | --- | --- | --- | --- | --- | --- |\n";
  }
  for (const std::string& name : names) {
    const model::Platform p = model::load_platform(name);
    for (const model::Check& row : model::validate(p)) {
      any = true;
      const model::Published& f = row.published;
      std::string published;
      if (f.busbw_gbps > 0) {
        published = fixed(f.busbw_gbps, 0) + " GB/s busbw";
      } else if (f.time_us_min == f.time_us_max) {
        published = fixed(f.time_us_min, 0) + " us";
      } else {
        published = fixed(f.time_us_min, 0) + "-" + fixed(f.time_us_max, 0) + " us";
      }
      const std::string predicted = f.busbw_gbps > 0
                                        ? fixed(row.predicted.busbw_gbps, 1) + " GB/s busbw"
                                        : fixed(row.predicted.seconds * 1e6, 1) + " us";
      const std::string error = (row.error >= 0 ? "+" : "") + fixed(row.error * 100, 1) + "%";
      std::string op(model::collective_name(f.op));
      if (f.nodes > 1) op += ", " + std::to_string(f.nodes) + " nodes";
      std::string source = f.source;
      if (f.calibrated) source += " (calibrated to it)";
      if (!f.note.empty()) source += "; " + f.note;
      if (flags.markdown) {
        std::cout << "| " << p.name << " | " << op << " | " << size_text(f.bytes) << " | "
                  << published << " | " << predicted << " (" << row.predicted.algorithm << ") | "
                  << error << " | " << source << " |\n";
      } else {
        std::printf("%-14s %-15s %9s  published %-20s predicted %-20s %7s  %s\n", p.name.c_str(),
                    op.c_str(), size_text(f.bytes).c_str(), published.c_str(), predicted.c_str(),
                    error.c_str(), source.c_str());
      }
    }
  }
  if (!any)
    std::cout << "sgpu model validate: no published figure in " << names.size() << " platform(s)\n";
  return 0;
}

// bench_collectives' op names ("allreduce") as the model's.
std::optional<Collective> bench_op(const std::string& name) {
  static const std::map<std::string, Collective> names{
      {"allreduce", Collective::kAllReduce},
      {"allgather", Collective::kAllGather},
      {"reducescatter", Collective::kReduceScatter},
      {"broadcast", Collective::kBroadcast},
      {"alltoall", Collective::kAllToAll}};
  const auto it = names.find(name);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

// The sgpu rows of a bench_collectives JSON (<op>/<dtype>/<bytes>/sgpu), one per
// repetition; failed rows and the floor's are left out.
std::vector<model::Measurement> read_bench(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + " is not Google Benchmark JSON: " + e.what());
  }
  if (!j.contains("benchmarks"))
    throw ConfigError(path + " is not Google Benchmark JSON: no \"benchmarks\"");
  const std::map<std::string, double> units{{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}};
  std::vector<model::Measurement> rows;
  for (const auto& b : j["benchmarks"]) {
    if (b.value("run_type", "iteration") != "iteration" || b.value("error_occurred", false))
      continue;
    const std::string name = b.value("run_name", b.value("name", ""));
    std::vector<std::string> parts;
    std::stringstream words(name);
    for (std::string part; std::getline(words, part, '/');) parts.push_back(part);
    if (parts.size() < 4 || parts[3] != "sgpu") continue;
    const auto op = bench_op(parts[0]);
    if (!op || !b.contains("ranks") || !b.contains("real_time")) continue;
    model::Measurement m;
    m.op = *op;
    m.bytes = std::stoll(parts[2]);
    m.ranks = static_cast<int>(b["ranks"].get<double>());
    const auto unit = units.find(b.value("time_unit", "ns"));
    m.seconds = b["real_time"].get<double>() * (unit == units.end() ? 1e-9 : unit->second);
    rows.push_back(m);
  }
  if (rows.empty())
    throw ConfigError(path + " has no bench_collectives sgpu rows (<op>/<dtype>/<bytes>/sgpu)");
  return rows;
}

int fit(const ModelFlags& flags) {
  const std::vector<model::Measurement> rows = read_bench(flags.bench_json);
  std::string base_name = flags.base;
  if (base_name == "auto") {
    base_name = model::default_platform_for(flags.gpu_type).value_or("h100-nvswitch");
  }
  const model::Platform base = model::load_platform(base_name);
  const std::string name = flags.name.empty() ? base.name + "-fitted" : flags.name;
  model::Platform fitted = model::fit_platform(base, rows, name);
  fitted.description = "fitted from " + flags.bench_json + " over " + base.name;
  const std::string text = model::platform_json(fitted);
  if (flags.output.empty()) {
    std::cout << text;
  } else {
    std::ofstream out(flags.output);
    out << text;
    if (!out.flush()) throw ConfigError("cannot write " + flags.output);
    std::cerr << "sgpu model fit: " << rows.size() << " timings -> " << flags.output
              << " (platform " << name << "; use it with SGPU_PLATFORM=" << flags.output
              << " or a node spec's @" << flags.output << ")\n";
  }
  return 0;
}

}  // namespace

std::function<int()> add_model_command(CLI::App& app) {
  auto flags = std::make_shared<ModelFlags>();
  CLI::App* cmd =
      app.add_subcommand("model", "The collective model: predicted times on real nodes");
  cmd->require_subcommand(1);
  cmd->footer(
      "Platforms are JSON files (sgpu model list says where). A simulated node predicts on\n"
      "its GPU type's platform, or the one its spec names after '@' (8xH100@a100-nvswitch).\n"
      "Examples:\n"
      "  sgpu model predict h100-nvswitch --ops all_reduce --min-bytes 1M --max-bytes 1G\n"
      "  sgpu model validate --markdown\n"
      "  sgpu model fit run.json --base h100-nvswitch --name my-node -o my-node.json");
  CLI::App* list_cmd =
      cmd->add_subcommand("list", "The platforms and the GPU types whose node each is");
  CLI::App* predict_cmd =
      cmd->add_subcommand("predict", "Predicted time, algbw and busbw per op and size");
  predict_cmd->add_option("platform", flags->predict_platform, "A platform's name or file")
      ->capture_default_str();
  predict_cmd
      ->add_option(
          "--ops", flags->ops,
          "all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv")
      ->delimiter(',')
      ->capture_default_str();
  predict_cmd->add_option("--min-bytes", flags->min_bytes, "Smallest message")
      ->capture_default_str();
  predict_cmd->add_option("--max-bytes", flags->max_bytes, "Largest message (sizes double)")
      ->capture_default_str();
  predict_cmd->add_option("--ranks", flags->ranks,
                          "Ranks (default: the platform's GPUs on each node)");
  predict_cmd
      ->add_option("--nodes", flags->nodes,
                   "Nodes the ranks are spread over, evenly (default 1; more than one times "
                   "the group on the platform's network)")
      ->check(CLI::PositiveNumber);
  CLI::App* validate_cmd =
      cmd->add_subcommand("validate", "The model against each platform's published figures");
  validate_cmd->add_option("platforms", flags->validate_platforms, "Platforms (default: all)");
  validate_cmd->add_flag("--markdown", flags->markdown, "A Markdown table");
  CLI::App* fit_cmd =
      cmd->add_subcommand("fit", "Fit a platform file to a real node's bench_collectives JSON");
  fit_cmd->footer(
      "BENCH.json is bench_collectives' --benchmark_out (format json) from the node, e.g. from\n"
      "ci/gpu-node. Each op measured gets one algorithm, \"fitted\", that reproduces its sgpu\n"
      "rows; the other ops keep the base platform's.");
  fit_cmd->add_option("bench_json", flags->bench_json, "bench_collectives' JSON")->required();
  fit_cmd
      ->add_option(
          "--base", flags->base,
          "The platform the unmeasured ops come from (auto: --gpu-type's node, else h100-nvswitch)")
      ->capture_default_str();
  fit_cmd->add_option("--gpu-type", flags->gpu_type, "The node's GPU type, for --base auto");
  fit_cmd->add_option("--name", flags->name, "The fitted platform's name (default: BASE-fitted)");
  fit_cmd->add_option("-o,--output", flags->output, "Where to write it (default: standard output)");
  return [=]() -> int {
    try {
      if (*list_cmd) return list();
      if (*predict_cmd) return predict(*flags);
      if (*validate_cmd) return validate(*flags);
      if (*fit_cmd) return fit(*flags);
    } catch (const std::invalid_argument& e) {
      std::cerr << "sgpu model: " << e.what() << "\n";
      return kUsageError;
    } catch (const Error& e) {
      std::cerr << "sgpu model: " << e.what() << "\n";
      return kUsageError;
    }
    return kUsageError;
  };
}

}  // namespace sgpu::cli
