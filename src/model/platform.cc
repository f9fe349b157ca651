#include "model/platform.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "contract/option_table.h"
#include "sgpu/errors.h"

namespace sgpu::model {
namespace {

using nlohmann::json;
using Curves = std::map<std::string, std::vector<std::pair<double, double>>>;  // by name
using OpAlgorithms = std::vector<std::pair<Collective, std::vector<Algorithm>>>;

constexpr std::pair<Collective, std::string_view> kNames[] = {
    {Collective::kAllReduce, "all_reduce"},
    {Collective::kAllGather, "all_gather"},
    {Collective::kReduceScatter, "reduce_scatter"},
    {Collective::kBroadcast, "broadcast"},
    {Collective::kReduce, "reduce"},
    {Collective::kAllToAll, "all_to_all"},
    {Collective::kSendRecv, "send_recv"},
};

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw ConfigError("platform file " + origin + ": " + what);
}

double efficiency(const std::vector<std::pair<double, double>>& curve, double bytes) {
  if (curve.empty()) return 1.0;
  if (bytes <= curve.front().first) return curve.front().second;
  if (bytes >= curve.back().first) return curve.back().second;
  const auto hi = std::upper_bound(curve.begin(), curve.end(), bytes,
                                   [](double b, const auto& point) { return b < point.first; });
  const auto lo = hi - 1;
  const double x =
      (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return lo->second + (hi->second - lo->second) * x;
}

// The steps a ring takes: its latency is paid once per step.
int ring_steps(Collective c, int ranks) {
  switch (c) {
    case Collective::kAllReduce:
      return 2 * (ranks - 1);
    case Collective::kSendRecv:
      return 1;
    default:
      return ranks - 1;
  }
}

constexpr std::pair<Steps, std::string_view> kSteps[] = {{Steps::kRing, "ring"},
                                                         {Steps::kOne, "one"},
                                                         {Steps::kTree, "tree"},
                                                         {Steps::kOneTree, "one_tree"}};

int floor_log2(int n) {
  int log = 0;
  while (n > 1) {
    n /= 2;
    ++log;
  }
  return log;
}

// An algorithm's latency on `span` (NOTE [The collective model], NOTE [The network between
// nodes]), in microseconds.
double latency_us(const Algorithm& a, Collective c, const Span& span) {
  const int nodes = std::max(span.nodes, 1);
  const bool across = nodes > 1;
  switch (a.steps) {
    case Steps::kOne:
      return a.base_latency_us + a.hop_latency_us + (across ? a.net_latency_us : 0);
    case Steps::kTree:
      return a.base_latency_us + 2 * ((span.ranks / nodes - 1) * a.hop_latency_us +
                                      floor_log2(nodes) * a.net_latency_us);
    case Steps::kOneTree:
      return a.base_latency_us + a.hop_latency_us + 2 * floor_log2(nodes) * a.net_latency_us;
    case Steps::kRing:
      break;
  }
  const int steps = ring_steps(c, span.ranks);
  const int net = !across ? 0 : std::min(steps, ring_steps(c, nodes));
  return a.base_latency_us + (steps - net) * a.hop_latency_us + net * a.net_latency_us;
}

// The fastest of `algorithms` on `span`, each algorithm's bus bandwidth held to what the
// NICs carry, `net_gbps` (0: not held; a NVLS tree on two nodes is held to twice it).
Prediction fastest(const std::vector<Algorithm>& algorithms, Collective c, double size,
                   const Span& span, double net_gbps) {
  Prediction best;
  best.seconds = std::numeric_limits<double>::infinity();
  for (const Algorithm& a : algorithms) {
    double busbw = a.bus_bandwidth_gbps * efficiency(a.efficiency, std::max(size, 1.0));
    if (net_gbps > 0)
      busbw = std::min(busbw, net_gbps * (a.steps == Steps::kOneTree && span.nodes <= 2 ? 2 : 1));
    const double algbw = busbw * 1e9 / bus_factor(c, span.ranks);
    const double seconds = latency_us(a, c, span) * 1e-6 + size / algbw;
    if (seconds < best.seconds) {
      best.seconds = seconds;
      best.algorithm = a.name;
    }
  }
  if (size > 0 && best.seconds > 0)
    best.busbw_gbps = size / best.seconds / 1e9 * bus_factor(c, span.ranks);
  return best;
}

double number(const json& j, const char* key, const std::string& where, const std::string& origin,
              bool required = true) {
  if (!j.contains(key)) {
    if (required) bad(origin, where + " has no \"" + key + "\"");
    return 0;
  }
  if (!j[key].is_number()) bad(origin, where + ": \"" + key + "\" is not a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < 0 || v > 1e7) {
    bad(origin, where + ": \"" + key + "\" is " + j[key].dump() + ", not a number from 0 to 1e7");
  }
  return v;
}

// `j`'s whole number `key` from `low` to `high`, or `fallback` when absent. A number written
// with a fraction, or too large for its type, is refused rather than converted.
std::int64_t whole(const json& j, const char* key, std::int64_t fallback, std::int64_t low,
                   std::int64_t high, const std::string& where, const std::string& origin) {
  if (!j.contains(key)) return fallback;
  const json& v = j[key];
  const bool fits =
      v.is_number_integer() &&
      (!v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(high));
  const std::int64_t value = fits ? v.get<std::int64_t>() : low - 1;
  if (value < low || value > high)
    bad(origin, where + ": \"" + key + "\" is " + v.dump() + ", not a whole number from " +
                    std::to_string(low) + " to " + std::to_string(high));
  return value;
}

std::vector<std::pair<double, double>> parse_curve(const json& j, const std::string& where,
                                                   const std::string& origin) {
  if (!j.is_array() || j.empty()) bad(origin, where + " is not a list of [bytes, fraction] points");
  std::vector<std::pair<double, double>> curve;
  for (const json& p : j) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
      bad(origin, where + ": " + p.dump() + " is not a [bytes, fraction] point");
    const double bytes = p[0].get<double>(), fraction = p[1].get<double>();
    if (!(bytes > 0) || !(bytes < 1e18) || !(fraction >= 1e-9) || fraction > 1.5)
      bad(origin,
          where + ": " + p.dump() + " needs bytes in (0, 1e18) and a fraction in [1e-9, 1.5]");
    if (!curve.empty() && bytes <= curve.back().first)
      bad(origin, where + ": the points' sizes must ascend (" + p.dump() + ")");
    curve.emplace_back(bytes, fraction);
  }
  return curve;
}

// `j`'s "efficiency", when it has one: a curve's name in `curves`, or the curve itself.
void parse_efficiency(const json& j, const Curves& curves, const std::string& at,
                      const std::string& origin, std::string& name,
                      std::vector<std::pair<double, double>>& points) {
  if (!j.contains("efficiency")) return;
  if (j["efficiency"].is_string()) {
    name = j["efficiency"].get<std::string>();
    const auto it = curves.find(name);
    if (it == curves.end()) bad(origin, at + ": no curve \"" + name + "\" in \"curves\"");
    points = it->second;
  } else {
    points = parse_curve(j["efficiency"], at + ": \"efficiency\"", origin);
  }
}

Algorithm parse_algorithm(const json& j, const Curves& curves, const std::string& where,
                          const std::string& origin) {
  if (!j.is_object()) bad(origin, where + " is not an object");
  Algorithm a;
  a.name = j.value("name", "");
  if (a.name.empty()) bad(origin, where + " has no \"name\"");
  const std::string at = where + " (" + a.name + ")";
  a.base_latency_us = number(j, "base_latency_us", at, origin);
  a.hop_latency_us = number(j, "hop_latency_us", at, origin, false);
  a.net_latency_us = number(j, "net_latency_us", at, origin, false);
  a.bus_bandwidth_gbps = number(j, "bus_bandwidth_gbps", at, origin);
  if (!(a.bus_bandwidth_gbps >= 1e-9))
    bad(origin, at + ": \"bus_bandwidth_gbps\" must be at least 1e-9");
  const std::string steps = j.value("steps", "ring");
  const auto* kind = std::find_if(std::begin(kSteps), std::end(kSteps),
                                  [&](const auto& entry) { return entry.second == steps; });
  if (kind == std::end(kSteps))
    bad(origin, at + ": \"steps\" is \"" + steps + "\", not ring, one, tree or one_tree");
  a.steps = kind->first;
  parse_efficiency(j, curves, at, origin, a.curve, a.efficiency);
  return a;
}

std::vector<Algorithm> parse_algorithms(const json& j, const Curves& curves,
                                        const std::string& where, const std::string& origin) {
  if (!j.is_array() || j.empty()) bad(origin, where + " is not a list of algorithms");
  std::vector<Algorithm> out;
  for (std::size_t i = 0; i < j.size(); ++i)
    out.push_back(parse_algorithm(j[i], curves, where + "[" + std::to_string(i) + "]", origin));
  return out;
}

// The algorithms `ops` lists for `c`, else `defaults`.
const std::vector<Algorithm>& algorithms_for(const OpAlgorithms& ops,
                                             const std::vector<Algorithm>& defaults, Collective c) {
  for (const auto& [op, list] : ops)
    if (op == c) return list;
  return defaults;
}

// `j`, an "ops" object (at `where`), into `ops` and `defaults`.
void parse_ops(const json& j, const Curves& curves, const std::string& where,
               const std::string& origin, OpAlgorithms& ops, std::vector<Algorithm>& defaults) {
  if (!j.is_object()) bad(origin, "no \"" + where + "\" object");
  std::set<Collective> listed;
  for (const auto& [op, list] : j.items()) {
    if (op == "default") {
      defaults = parse_algorithms(list, curves, where + ".default", origin);
      continue;
    }
    const auto c = parse_collective(op);
    if (!c)
      bad(origin, "\"" + where + "\" names \"" + op +
                      "\": not all_reduce, all_gather, reduce_scatter, "
                      "broadcast, reduce, all_to_all, send_recv or default");
    listed.insert(*c);
    ops.emplace_back(*c, parse_algorithms(list, curves, where + "." + op, origin));
  }
  if (defaults.empty() && listed.size() < std::size(kNames))
    bad(origin, "\"" + where + "\" lists neither every collective nor a \"default\"");
}

Network parse_network(const json& j, const Curves& curves, const std::string& origin) {
  if (!j.is_object()) bad(origin, "\"network\" is not an object");
  Network n;
  n.description = j.value("description", "");
  n.nics_per_node = static_cast<int>(number(j, "nics_per_node", "network", origin));
  n.nic_bandwidth_gbps = number(j, "nic_bandwidth_gbps", "network", origin);
  if (n.nics_per_node < 1 || !(n.nic_bandwidth_gbps >= 1e-9))
    bad(origin, "network: \"nics_per_node\" and \"nic_bandwidth_gbps\" must be above 0");
  if (!j.contains("ops")) bad(origin, "\"network\" has no \"ops\" object");
  parse_ops(j["ops"], curves, "network.ops", origin, n.ops, n.default_algorithms);
  parse_efficiency(j, curves, "network", origin, n.curve, n.efficiency);
  for (const json& s : j.value("sources", json::array())) n.sources.push_back(s.get<std::string>());
  return n;
}

json curve_json(const std::vector<std::pair<double, double>>& curve) {
  json out = json::array();
  for (const auto& [bytes, fraction] : curve) out.push_back({bytes, fraction});
  return out;
}

void efficiency_json(json& j, const std::string& name,
                     const std::vector<std::pair<double, double>>& points, const Curves& curves) {
  if (!name.empty() && curves.contains(name)) {
    j["efficiency"] = name;
  } else if (!points.empty()) {
    j["efficiency"] = curve_json(points);
  }
}

json algorithm_json(const Algorithm& a, const Curves& curves) {
  json j = {{"name", a.name},
            {"base_latency_us", a.base_latency_us},
            {"hop_latency_us", a.hop_latency_us},
            {"steps", steps_name(a.steps)},
            {"bus_bandwidth_gbps", a.bus_bandwidth_gbps}};
  if (a.net_latency_us > 0) j["net_latency_us"] = a.net_latency_us;
  efficiency_json(j, a.curve, a.efficiency, curves);
  return j;
}

json ops_json(const OpAlgorithms& ops, const std::vector<Algorithm>& defaults,
              const Curves& curves) {
  json out = json::object();
  for (const auto& [op, list] : ops) {
    json& entry = out[std::string(collective_name(op))] = json::array();
    for (const Algorithm& a : list) entry.push_back(algorithm_json(a, curves));
  }
  if (!defaults.empty()) {
    json& entry = out["default"] = json::array();
    for (const Algorithm& a : defaults) entry.push_back(algorithm_json(a, curves));
  }
  return out;
}

// A fraction in (0, 1], or `fallback` when absent.
double fraction(const json& j, const char* key, double fallback, const std::string& origin) {
  if (!j.contains(key)) return fallback;
  const double value = number(j, key, "compute.kernels", origin);
  if (value <= 0 || value > 1)
    bad(origin, std::string("compute.kernels: \"") + key + "\" is " + j[key].dump() +
                    ", not a fraction above 0 and at most 1");
  return value;
}

KernelCosts parse_kernels(const json& j, const std::string& origin) {
  if (!j.is_object()) bad(origin, "compute: \"kernels\" is not an object");
  KernelCosts k;
  k.sms = static_cast<int>(number(j, "sms", "compute.kernels", origin));
  if (k.sms <= 0) bad(origin, "compute.kernels: \"sms\" is not above 0");
  for (const json& tile : j.value("matmul_tiles", json::array())) {
    if (!tile.is_array() || tile.size() != 3 || !tile[0].is_number_integer() ||
        !tile[1].is_number_integer() || !tile[2].is_number() || tile[0].get<double>() < 1 ||
        tile[1].get<double>() < 1 || tile[0].get<double>() > 65536 ||
        tile[1].get<double>() > 65536 || tile[2].get<double>() <= 0 || tile[2].get<double>() > 1)
      bad(origin, "compute.kernels.matmul_tiles: " + tile.dump() +
                      " is not [rows, cols, fraction of the peak in (0, 1]]");
    k.matmul_tiles.push_back({tile[0].get<int>(), tile[1].get<int>(), tile[2].get<double>()});
  }
  k.attention_efficiency = fraction(j, "attention_efficiency", 1, origin);
  k.memory_efficiency = fraction(j, "memory_efficiency", 1, origin);
  k.kernel_floor_us = number(j, "kernel_floor_us", "compute.kernels", origin, false);
  k.host_us = number(j, "host_us", "compute.kernels", origin, false);
  for (const json& s : j.value("sources", json::array())) k.sources.push_back(s.get<std::string>());
  if (j.contains("validation")) {
    const json& v = j["validation"];
    if (!v.is_object() || !v.value("dtypes", json()).is_array())
      bad(origin, "compute.kernels: \"validation\" is not {dtypes: [...], runs, typical_error}");
    for (const json& d : v["dtypes"]) {
      if (!d.is_string())
        bad(origin, "compute.kernels.validation: the dtype " + d.dump() + " is not a name");
      k.validated_dtypes.push_back(d.get<std::string>());
    }
    k.validated_runs = static_cast<int>(number(v, "runs", "compute.kernels.validation", origin));
    k.typical_error = number(v, "typical_error", "compute.kernels.validation", origin);
    if (k.validated_runs < 1 || k.typical_error < 0)
      bad(origin,
          "compute.kernels.validation: \"runs\" is not 1 or more, or "
          "\"typical_error\" is below 0");
  }
  return k;
}

json kernels_json(const KernelCosts& k) {
  json tiles = json::array();
  for (const MatmulTile& t : k.matmul_tiles) tiles.push_back({t.rows, t.cols, t.efficiency});
  json j = {{"sms", k.sms},
            {"matmul_tiles", tiles},
            {"attention_efficiency", k.attention_efficiency},
            {"memory_efficiency", k.memory_efficiency},
            {"kernel_floor_us", k.kernel_floor_us},
            {"host_us", k.host_us},
            {"sources", k.sources}};
  if (!k.validated_dtypes.empty())
    j["validation"] = {{"dtypes", k.validated_dtypes},
                       {"runs", k.validated_runs},
                       {"typical_error", k.typical_error}};
  return j;
}

Roofline parse_roofline(const json& j, const std::string& origin) {
  if (!j.is_object()) bad(origin, "\"compute\" is not an object");
  Roofline r;
  const json peaks = j.value("peak_tflops", json::object());
  if (!peaks.is_object() || peaks.empty())
    bad(origin, "\"compute\" has no \"peak_tflops\" object of dtype: TFLOPS");
  for (const auto& [dtype, value] : peaks.items()) {
    const double tflops = number(peaks, dtype.c_str(), "compute.peak_tflops", origin);
    if (tflops <= 0) bad(origin, "compute.peak_tflops: \"" + dtype + "\" is not above 0");
    r.peak_tflops.emplace_back(dtype, tflops);
  }
  if (std::none_of(r.peak_tflops.begin(), r.peak_tflops.end(),
                   [](const auto& p) { return p.first == "float32"; }))
    bad(origin, "compute.peak_tflops has no \"float32\", the peak of a dtype not listed");
  r.memory_bandwidth_gbps = number(j, "memory_bandwidth_gbps", "compute", origin);
  if (r.memory_bandwidth_gbps <= 0) bad(origin, "compute: \"memory_bandwidth_gbps\" is 0");
  if (j.contains("efficiency")) {
    r.efficiency = number(j, "efficiency", "compute", origin);
    if (r.efficiency <= 0 || r.efficiency > 1)
      bad(origin, "compute: \"efficiency\" is " + j["efficiency"].dump() +
                      ", not a fraction above 0 and at most 1");
  }
  for (const json& s : j.value("sources", json::array())) r.sources.push_back(s.get<std::string>());
  if (j.contains("kernels")) r.kernels = parse_kernels(j["kernels"], origin);
  return r;
}

json roofline_json(const Roofline& r) {
  json peaks = json::object();
  for (const auto& [dtype, tflops] : r.peak_tflops) peaks[dtype] = tflops;
  json j = {{"peak_tflops", peaks},
            {"memory_bandwidth_gbps", r.memory_bandwidth_gbps},
            {"efficiency", r.efficiency},
            {"sources", r.sources}};
  if (!r.kernels.empty()) j["kernels"] = kernels_json(r.kernels);
  return j;
}

std::filesystem::path file_for(std::string_view name) {
  for (const std::string& dir : platform_path()) {
    std::filesystem::path file = std::filesystem::path(dir) / (std::string(name) + ".json");
    std::error_code ec;
    if (std::filesystem::is_regular_file(file, ec)) return file;
  }
  return {};
}

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("cannot read the platform file " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string_view collective_name(Collective c) {
  for (const auto& [value, name] : kNames)
    if (value == c) return name;
  return "?";
}

std::optional<Collective> parse_collective(std::string_view name) {
  for (const auto& [value, n] : kNames)
    if (n == name) return value;
  return std::nullopt;
}

std::optional<Collective> collective_of(std::string_view op) {
  if (op == "barrier" || op.starts_with("all_reduce")) return Collective::kAllReduce;
  if (op.starts_with("all_gather") || op == "gather" || op == "scatter")
    return Collective::kAllGather;
  if (op.starts_with("reduce_scatter")) return Collective::kReduceScatter;
  if (op == "broadcast") return Collective::kBroadcast;
  if (op == "reduce") return Collective::kReduce;
  if (op.starts_with("all_to_all") || op == "alltoall" || op == "alltoall_base")
    return Collective::kAllToAll;
  if (op == "send" || op == "recv" || op == "recv_any_source") return Collective::kSendRecv;
  return std::nullopt;
}

std::int64_t parse_message_size(std::string_view text) {
  std::int64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  int shift = -1;
  if (unit.empty()) shift = 0;
  if (unit == "K" || unit == "k") shift = 10;
  if (unit == "M" || unit == "m") shift = 20;
  if (unit == "G" || unit == "g") shift = 30;
  if (ec != std::errc() || end == text.data() || number < 0 || shift < 0 ||
      number > (std::numeric_limits<std::int64_t>::max() >> shift)) {
    throw std::invalid_argument("\"" + std::string(text) +
                                "\" is not a size like 8, 4K, 64M or 1G");
  }
  return number << shift;
}

double bus_factor(Collective c, int ranks) {
  if (ranks <= 1) return 1.0;
  const double n = ranks;
  switch (c) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return (n - 1) / n;
    default:
      return 1.0;
  }
}

double Roofline::peak_for(std::string_view dtype) const {
  double family = 0, float32 = 0;
  for (const auto& [name, tflops] : peak_tflops) {
    if (name == dtype) return tflops;
    if (name == "float8" && dtype.starts_with("float8_")) family = tflops;
    if (name == "float32") float32 = tflops;
  }
  return family > 0 ? family : float32;
}

double roofline_seconds(const Roofline& roofline, double flops, double bytes,
                        std::string_view dtype) {
  if (roofline.empty()) return 0;
  const double peak = roofline.peak_for(dtype) * 1e12;
  const double compute = flops > 0 && peak > 0 ? flops / peak : 0;
  const double memory = bytes / (roofline.memory_bandwidth_gbps * 1e9);
  return std::max(compute, memory) / roofline.efficiency;
}

const std::vector<Algorithm>& Platform::algorithms(Collective c) const {
  return algorithms_for(ops, default_algorithms, c);
}

const std::vector<Algorithm>& Network::algorithms(Collective c) const {
  return algorithms_for(ops, default_algorithms, c);
}

std::string_view steps_name(Steps s) {
  for (const auto& [value, name] : kSteps)
    if (value == s) return name;
  return "?";
}

Span span_of(const std::vector<int>& members, int ranks_per_node) {
  const int ranks = static_cast<int>(members.size());
  if (ranks_per_node <= 0 || ranks == 0) return {ranks, 1, ranks};
  std::map<int, int> on_node;
  for (int rank : members) ++on_node[rank / ranks_per_node];
  int fewest = ranks;
  for (const auto& [node, count] : on_node) fewest = std::min(fewest, count);
  return {ranks, static_cast<int>(on_node.size()), fewest};
}

void require_network(const Platform& platform, const Span& span) {
  if (span.nodes <= 1 || !platform.network.empty()) return;
  throw ConfigError("the platform " + platform.name + " models one node, and a group of " +
                    std::to_string(span.ranks) + " ranks spans " + std::to_string(span.nodes) +
                    " nodes: give its file a \"network\" object (docs/communication.md, "
                    "\"Between nodes\") or choose a platform that has one");
}

Prediction predict(const Platform& platform, Collective c, std::int64_t bytes, int ranks) {
  return predict(platform, c, bytes, Span{ranks, 1, ranks});
}

Prediction predict(const Platform& platform, Collective c, std::int64_t bytes, const Span& span) {
  Prediction none;
  none.algorithm = "none";
  if (span.ranks <= 1 || (bytes <= 0 && c == Collective::kSendRecv)) return none;
  const double size = static_cast<double>(std::max<std::int64_t>(bytes, 0));
  if (span.nodes <= 1) return fastest(platform.algorithms(c), c, size, span, 0);
  require_network(platform, span);
  const Network& net = platform.network;
  const int per_node = span.per_node > 0 ? span.per_node : std::max(span.ranks / span.nodes, 1);
  const double nic_gbps = std::min(per_node, net.nics_per_node) * net.nic_bandwidth_gbps *
                          efficiency(net.efficiency, std::max(size, 1.0));
  return fastest(net.algorithms(c), c, size, span, nic_gbps);
}

Platform parse_platform(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(origin, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(origin, "not a JSON object");
  Platform p;
  p.origin = origin;
  try {
    p.name = j.value("name", "");
    if (p.name.empty()) bad(origin, "no \"name\"");
    p.description = j.value("description", "");
    p.gpus = static_cast<int>(whole(j, "gpus", 0, 0, 1 << 16, "the node", origin));
    const json default_for = j.value("default_for", json::array());
    for (const json& t : default_for) p.default_for.push_back(upper(t.get<std::string>()));
    const json sources = j.value("sources", json::array());
    for (const json& s : sources) p.sources.push_back(s.get<std::string>());
    Curves curves;
    const json listed_curves = j.value("curves", json::object());
    if (!listed_curves.is_object()) bad(origin, "\"curves\" is not an object of named curves");
    for (const auto& [name, points] : listed_curves.items())
      curves[name] = parse_curve(points, "curve \"" + name + "\"", origin);
    parse_ops(j.value("ops", json()), curves, "ops", origin, p.ops, p.default_algorithms);
    const json published = j.value("published", json::array());
    for (const json& f : published) {
      Published pub;
      const auto c = parse_collective(f.value("op", ""));
      if (!c) bad(origin, "a published figure names no known op: " + f.dump());
      pub.op = *c;
      pub.bytes = whole(f, "bytes", 0, 0, std::int64_t{1} << 50, "a published figure", origin);
      if (pub.bytes <= 0) bad(origin, "a published figure has no \"bytes\" above 0: " + f.dump());
      pub.busbw_gbps = f.value("busbw_gbps", 0.0);
      if (f.contains("time_us")) {
        if (f["time_us"].is_array() && f["time_us"].size() == 2) {
          pub.time_us_min = f["time_us"][0].get<double>();
          pub.time_us_max = f["time_us"][1].get<double>();
        } else {
          pub.time_us_min = pub.time_us_max = f["time_us"].get<double>();
        }
      }
      if ((pub.busbw_gbps > 0) == (pub.time_us_max > 0) || pub.time_us_min > pub.time_us_max)
        bad(origin,
            "a published figure needs one of busbw_gbps or time_us (a time or [min, max]): " +
                f.dump());
      pub.source = f.value("source", "");
      pub.note = f.value("note", "");
      pub.calibrated = f.value("calibrated", false);
      pub.ranks = static_cast<int>(whole(f, "ranks", 0, 0, 1 << 20, "a published figure", origin));
      pub.nodes = static_cast<int>(whole(f, "nodes", 1, 1, 1 << 20, "a published figure", origin));
      if (pub.ranks > 0 && pub.ranks < pub.nodes)
        bad(origin, "a published figure's \"ranks\" and \"nodes\" are not a group: " + f.dump());
      p.published.push_back(std::move(pub));
    }
    if (j.contains("compute")) p.compute = parse_roofline(j["compute"], origin);
    if (j.contains("network")) p.network = parse_network(j["network"], curves, origin);
    for (const Published& f : p.published)
      if (f.nodes > 1 && p.network.empty())
        bad(origin, "a published figure is on " + std::to_string(f.nodes) +
                        " nodes, but the file has no \"network\" to time it on");
  } catch (const json::exception& e) {
    bad(origin, std::string("a field has the wrong type: ") + e.what());
  }
  return p;
}

std::string platform_json(const Platform& p) {
  Curves curves;
  auto collect = [&](const std::vector<Algorithm>& list) {
    for (const Algorithm& a : list)
      if (!a.curve.empty()) curves[a.curve] = a.efficiency;
  };
  collect(p.default_algorithms);
  for (const auto& [op, list] : p.ops) collect(list);
  collect(p.network.default_algorithms);
  for (const auto& [op, list] : p.network.ops) collect(list);
  if (!p.network.curve.empty()) curves[p.network.curve] = p.network.efficiency;
  json j = {{"name", p.name},
            {"description", p.description},
            {"gpus", p.gpus},
            {"default_for", p.default_for},
            {"sources", p.sources}};
  json c = json::object();
  for (const auto& [name, curve] : curves) c[name] = curve_json(curve);
  j["curves"] = c;
  j["ops"] = ops_json(p.ops, p.default_algorithms, curves);
  json published = json::array();
  for (const Published& f : p.published) {
    json row = {{"op", collective_name(f.op)}, {"bytes", f.bytes}, {"source", f.source}};
    if (f.busbw_gbps > 0) row["busbw_gbps"] = f.busbw_gbps;
    if (f.time_us_max > 0) {
      row["time_us"] = f.time_us_min == f.time_us_max ? json(f.time_us_min)
                                                      : json({f.time_us_min, f.time_us_max});
    }
    if (!f.note.empty()) row["note"] = f.note;
    if (f.calibrated) row["calibrated"] = true;
    if (f.ranks > 0) row["ranks"] = f.ranks;
    if (f.nodes > 1) row["nodes"] = f.nodes;
    published.push_back(row);
  }
  j["published"] = published;
  if (!p.compute.empty()) j["compute"] = roofline_json(p.compute);
  if (!p.network.empty()) {
    j["network"] = {{"description", p.network.description},
                    {"nics_per_node", p.network.nics_per_node},
                    {"nic_bandwidth_gbps", p.network.nic_bandwidth_gbps},
                    {"ops", ops_json(p.network.ops, p.network.default_algorithms, curves)},
                    {"sources", p.network.sources}};
    efficiency_json(j["network"], p.network.curve, p.network.efficiency, curves);
  }
  return j.dump(2) + "\n";
}

std::vector<std::string> platform_path() {
  std::vector<std::string> dirs;
  if (const std::string env = contract::setting_text("SGPU_PLATFORM_PATH"); !env.empty()) {
    std::string_view rest = env;
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) dirs.emplace_back(dir);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  dirs.emplace_back(SGPU_PLATFORM_SOURCE_DIR);
  dirs.emplace_back(SGPU_PLATFORM_INSTALL_DIR);
  return dirs;
}

Platform load_platform(std::string_view name_or_file) {
  const std::string what(name_or_file);
  std::filesystem::path file;
  if (what.find('/') != std::string::npos || what.ends_with(".json")) {
    file = what;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) throw ConfigError("no platform file " + what);
  } else {
    file = file_for(what);
    if (file.empty()) {
      std::string known;
      for (const std::string& name : platform_names()) known += (known.empty() ? "" : ", ") + name;
      throw ConfigError("no platform \"" + what + "\": the platforms are " +
                        (known.empty() ? std::string("none") : known) +
                        " (files <name>.json in SGPU_PLATFORM_PATH or " +
                        SGPU_PLATFORM_INSTALL_DIR + "), or name a platform file by its path");
    }
  }
  return parse_platform(read_file(file), file.string());
}

std::vector<std::string> platform_names() {
  std::set<std::string> names;
  for (const std::string& dir : platform_path()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".json") names.insert(entry.path().stem().string());
    }
  }
  return {names.begin(), names.end()};
}

std::optional<std::string> default_platform_for(std::string_view gpu_type) {
  const std::string type = upper(gpu_type);
  for (const std::string& name : platform_names()) {
    const Platform p = load_platform(name);
    if (std::find(p.default_for.begin(), p.default_for.end(), type) != p.default_for.end())
      return name;
  }
  return std::nullopt;
}

std::vector<Check> validate(const Platform& platform) {
  std::vector<Check> rows;
  const int node = platform.gpus > 0 ? platform.gpus : 8;
  for (const Published& f : platform.published) {
    Check row;
    row.published = f;
    const int ranks = f.ranks > 0 ? f.ranks : node * f.nodes;
    row.predicted = predict(platform, f.op, f.bytes, Span{ranks, f.nodes, ranks / f.nodes});
    const double predicted_us = row.predicted.seconds * 1e6;
    if (f.busbw_gbps > 0) {
      row.published_us =
          static_cast<double>(f.bytes) * bus_factor(f.op, ranks) / (f.busbw_gbps * 1e9) * 1e6;
      row.error = predicted_us / row.published_us - 1;
    } else {
      row.published_us = (f.time_us_min + f.time_us_max) / 2;
      if (predicted_us < f.time_us_min) {
        row.error = predicted_us / f.time_us_min - 1;
      } else if (predicted_us > f.time_us_max) {
        row.error = predicted_us / f.time_us_max - 1;
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

Platform fit_platform(const Platform& base, const std::vector<Measurement>& measurements,
                      const std::string& name) {
  Platform out = base;
  out.name = name;
  out.origin.clear();
  out.published.clear();
  out.sources = {"fitted from bench_collectives timings by `sgpu model fit`"};
  std::map<Collective, std::map<std::int64_t, Measurement>> by_op;  // the fastest per size
  for (const Measurement& m : measurements) {
    if (!(m.seconds > 0) || m.bytes <= 0 || m.ranks < 2) continue;
    auto [it, fresh] = by_op[m.op].try_emplace(m.bytes, m);
    if (!fresh && m.seconds < it->second.seconds) it->second = m;
  }
  if (by_op.empty())
    throw ConfigError("no measurement to fit: every row had no time, no bytes or one rank");
  for (const auto& entry : by_op) {
    const Collective op = entry.first;
    std::vector<Measurement> rows;
    for (const auto& [bytes, m] : entry.second) rows.push_back(m);
    const int ranks = rows.back().ranks;
    for (const Measurement& m : rows)
      if (m.ranks != ranks)
        throw ConfigError("the " + std::string(collective_name(op)) + " timings mix world sizes (" +
                          std::to_string(m.ranks) + " and " + std::to_string(ranks) +
                          "): fit one at a time");
    // The latency: where the line through the two smallest sizes meets zero bytes, kept
    // below every measured time (a noisy run's larger message can be the faster) so that
    // every measured size has some bandwidth and is reproduced.
    double latency = 0;
    if (rows.size() >= 2) {
      const double t0 = rows[0].seconds, t1 = rows[1].seconds;
      const double s0 = static_cast<double>(rows[0].bytes), s1 = static_cast<double>(rows[1].bytes);
      latency = t0 - s0 * (t1 - t0) / (s1 - s0);
    }
    double fastest = rows[0].seconds;
    for (const Measurement& m : rows) fastest = std::min(fastest, m.seconds);
    latency = std::clamp(latency, 0.0, fastest * 0.999);
    std::vector<std::pair<double, double>> busbw;  // beyond the latency
    double peak = 0;
    for (const Measurement& m : rows) {
      const double beyond = m.seconds - latency;  // > 0: the latency is below every time
      const double b = static_cast<double>(m.bytes) / beyond * bus_factor(op, ranks) / 1e9;
      busbw.emplace_back(static_cast<double>(m.bytes), b);
      peak = std::max(peak, b);
    }
    Algorithm fitted;
    fitted.name = "fitted";
    fitted.base_latency_us = latency * 1e6;
    fitted.steps = Steps::kOne;
    fitted.bus_bandwidth_gbps = peak;
    // Held within what a platform file may say (a fraction of 1e-9 is a size a billion
    // times slower than the fastest).
    for (const auto& [bytes, b] : busbw)
      fitted.efficiency.emplace_back(bytes, std::max(b / peak, 1e-9));
    fitted.curve = "fitted_" + std::string(collective_name(op));
    auto slot =
        std::find_if(out.ops.begin(), out.ops.end(), [&](const auto& e) { return e.first == op; });
    if (slot == out.ops.end()) {
      out.ops.emplace_back(op, std::vector<Algorithm>{fitted});
    } else {
      slot->second = {fitted};
    }
  }
  return out;
}

}  // namespace sgpu::model
