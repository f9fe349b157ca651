// NOTE [The collective model]
// What a collective would take on a real node, predicted from a platform file: the
// figures that CI runs without GPUs can hold a change to, beside the exact accounting of
// what the collectives moved (NOTE [Communication accounting]).
//
// The model is NCCL's own (src/graph/tuning.cc): each op has candidate algorithms (ring,
// NVLS) in protocols (LL, LL128, Simple), each with a latency and a bus bandwidth, and the
// fastest one is taken. For a message of `bytes` on n ranks:
//   latency = base + steps · per-hop latency   (steps: 2(n−1) for a ring all-reduce,
//                                               n−1 for the other ring collectives,
//                                               1 for an algorithm in one hop: NVLS)
//   algbw   = bus bandwidth · efficiency(bytes) / bus factor(op, n)
//   time    = latency + bytes / algbw
// with nccl-tests' bus factors (2(n−1)/n for all-reduce, (n−1)/n for all-gather,
// reduce-scatter and all-to-all, 1 for broadcast, reduce and transfers). The efficiency
// curve is what NCCL's constants alone miss (its maintainers call the model "full of
// empirical corrections", NVIDIA/nccl#535): the fraction of the bus bandwidth a message of
// that size reaches beyond the latency, interpolated in log-size between the file's points
// and held flat beyond them.
//
// A platform file (JSON, read at run time; src/model/platforms/ in the source tree,
// share/sgpu/platforms installed, or any folder in SGPU_PLATFORM_PATH) holds:
//   name, description, gpus, default_for   the GPU types whose node it is by default
//   curves        named efficiency curves: [[bytes, fraction], ...], ascending
//   ops           op -> [algorithm, ...]; "default" for the ops not listed. An algorithm:
//                 {name, base_latency_us, hop_latency_us, steps: "ring" | "one",
//                  bus_bandwidth_gbps, efficiency: a curve's name (none: 1.0)}
//   published     figures measured on such a node, with their sources: {op, bytes,
//                 busbw_gbps | time_us | [time_us_min, time_us_max], source, calibrated
//                 (the figure the constants were set from, not an independent check)}
//   sources       where the constants come from
//   compute       the GPU's roofline (NOTE [The compute model]); a file without it
//                 predicts collectives only
//   network       the links between nodes (NOTE [The network between nodes]); a file
//                 without it models one node
//
// NOTE [The network between nodes]
// A group whose ranks sit on several nodes is timed as NCCL times it (src/graph/tuning.cc):
// with the network's own algorithms (the file's "network.ops"), whose latency counts the
// steps that cross a node's edge at the network's latency and the rest at NVLink's, and
// whose bandwidth is what the group's NICs carry. For n ranks on N nodes, at least p of
// them on every node (p = n/N for an even spread):
//   ring      latency = base + (s − s_net) · hop + s_net · net
//             (s as a ring on one node; s_net: 2(N−1) for all-reduce, N−1 for the other
//              ring collectives, 1 for a transfer)
//   tree      latency = base + 2 · ((n/N − 1) · hop + log2(N) · net)   (all-reduce)
//   one       latency = base + hop + net                   (NVLS with the network's help)
//   one_tree  latency = base + hop + 2 · log2(N) · net     (NVLS inside, a tree between)
//   busbw     = min(the algorithm's bus bandwidth · its efficiency(bytes),
//                   min(p, NICs a node) · NIC bandwidth · the network's efficiency(bytes))
// Each rank has a NIC of its own on a rail-optimised fabric, so a group crosses the network
// through as many NICs as it has ranks on a node: an HSDP replica group of one rank a node
// has one NIC, a world of 8 a node has all 8. NCCL's NVLS tree is held to twice that on
// two nodes (tuning.cc's two-node case: a tree on two nodes goes beyond the NICs, as
// NCCL's maintainers say in nccl-tests#196). A group inside one node is timed by "ops"
// (NOTE [The collective model]). The "network" object:
//   {description, nics_per_node, nic_bandwidth_gbps (one NIC, one way, GB/s, as NCCL
//    reaches it), efficiency (a curve, by name or itself: the share of the NICs a message
//    of that size reaches), ops (as "ops", each algorithm with "net_latency_us" and steps
//    "ring", "tree", "one" or "one_tree"), sources}
// A platform without one refuses a group that spans nodes (ConfigError), rather than time
// it on NVLink.
//
// NOTE [The compute model]
// What an operator would take on one GPU of the platform, for a step run in shape-only
// compute (docs/simulation.md): the roofline. An operator doing `flops` floating-point
// operations in `dtype` and moving `bytes` to and from the GPU's memory takes
//   time = max(flops / peak(dtype), bytes / memory bandwidth) / efficiency
// with the datasheet's dense peak per dtype ("bfloat16", "float16", "float32" (CUDA cores),
// "tf32" (float32 on tensor cores, when torch allows it), "float64", "float8" (every
// float8_* of torch's); a dtype not listed is timed at float32's peak) and its memory
// bandwidth. `efficiency` (1 by default) is the fraction of both peaks a step reaches: set
// from one real node's step time (docs/simulation.md, "Calibrating the estimate"). It
// leaves out what a roofline cannot see: kernel launch and framework time, each kernel's
// own efficiency (a small matmul reaches far less than the peak), caches, and the overlap
// of compute with collectives.
// The file's "compute" object:
//   {peak_tflops: {dtype: TFLOPS, ...}, memory_bandwidth_gbps, efficiency, sources,
//    kernels (NOTE [The kernel model] in model/kernels.h: what each kernel reaches of the
//    roofline, and the launch and host costs the roofline leaves out)}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/kernels.h"

namespace sgpu::model {

// The collectives the model knows; every recorded op maps to one (collective_of).
enum class Collective {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv
};

std::string_view collective_name(Collective c);  // "all_reduce", ..., "send_recv"
std::optional<Collective> parse_collective(std::string_view name);
// A recorded op's name (contract::op_name: "all_gather_into_tensor", "barrier", "recv", ...)
// as the collective NCCL runs for it. A barrier is NCCL's one-element all-reduce; gather
// and scatter move what an all-gather does through their root.
std::optional<Collective> collective_of(std::string_view op_name);

// A message size as nccl-tests reads -b and -e: "8", "4K", "64M", "1G" (binary units).
// Throws std::invalid_argument for anything else.
std::int64_t parse_message_size(std::string_view text);

// nccl-tests' bus factor: busbw = algbw · bus_factor.
double bus_factor(Collective c, int ranks);

// How an algorithm's latency grows with its ranks (NOTE [The collective model], NOTE [The
// network between nodes]).
enum class Steps {
  kRing,    // a step per hop of the ring
  kOne,     // one hop, whatever n (NVLS)
  kTree,    // a tree: its depth inside a node and across nodes
  kOneTree  // NVLS inside each node, a tree between them
};
std::string_view steps_name(Steps s);  // "ring", "one", "tree", "one_tree"

struct Algorithm {
  std::string name;  // "ring/Simple", "nvls/Simple", ...
  double base_latency_us = 0;
  double hop_latency_us = 0;  // a hop inside a node
  double net_latency_us = 0;  // a hop between nodes (the network's algorithms)
  Steps steps = Steps::kRing;
  double bus_bandwidth_gbps = 0;
  std::vector<std::pair<double, double>> efficiency;  // (bytes, fraction); empty: 1.0
  std::string curve;                                  // the curve's name, "" for none
};

// A figure measured on a real node of the platform's kind.
struct Published {
  Collective op = Collective::kAllReduce;
  std::int64_t bytes = 0;
  double busbw_gbps = 0;                    // 0 when the source gives a time
  double time_us_min = 0, time_us_max = 0;  // a time, or a range of times
  std::string source;
  std::string note;
  bool calibrated = false;  // the constants were set from it
  int ranks = 0;            // the ranks measured; 0: the platform's GPUs
  int nodes = 1;            // the nodes they were on
};

// A GPU's roofline (NOTE [The compute model]).
struct Roofline {
  std::vector<std::pair<std::string, double>> peak_tflops;  // dtype -> dense peak, TFLOPS
  double memory_bandwidth_gbps = 0;                         // 0: the platform has none
  double efficiency = 1;                                    // (0, 1]
  std::vector<std::string> sources;
  KernelCosts kernels;  // NOTE [The kernel model]; empty: the roofline alone

  bool empty() const { return memory_bandwidth_gbps <= 0; }
  // The dtype's peak: its own, else its family's ("float8" for torch's "float8_e4m3fn"
  // and "float8_e5m2"), else float32's.
  double peak_for(std::string_view dtype) const;
};

// One operator's time on the roofline: max(flops / peak, bytes / bandwidth) / efficiency;
// 0 for an empty roofline.
double roofline_seconds(const Roofline& roofline, double flops, double bytes,
                        std::string_view dtype);

// The links between a platform's nodes (NOTE [The network between nodes]).
struct Network {
  std::string description;
  int nics_per_node = 0;          // 0: the platform models one node
  double nic_bandwidth_gbps = 0;  // one NIC, one way, GB/s
  std::vector<std::pair<Collective, std::vector<Algorithm>>> ops;
  std::vector<Algorithm> default_algorithms;
  // The fraction of the NICs' bandwidth a message of that size reaches (as an algorithm's
  // curve; empty: 1.0), and the curve's name.
  std::vector<std::pair<double, double>> efficiency;
  std::string curve;
  std::vector<std::string> sources;

  bool empty() const { return nics_per_node <= 0; }
  const std::vector<Algorithm>& algorithms(Collective c) const;
};

struct Platform {
  std::string name;
  std::string description;
  int gpus = 0;
  std::vector<std::string> default_for;  // GPU types, as gpu_type.h normalises them
  std::vector<std::pair<Collective, std::vector<Algorithm>>> ops;
  std::vector<Algorithm> default_algorithms;
  std::vector<Published> published;
  std::vector<std::string> sources;
  Roofline compute;    // empty when the file has no "compute"
  Network network;     // empty when the file has no "network"
  std::string origin;  // the file it came from

  const std::vector<Algorithm>& algorithms(Collective c) const;
};

struct Prediction {
  double seconds = 0;
  double busbw_gbps = 0;  // nccl-tests' bus bandwidth at that time
  std::string algorithm;  // the fastest: "nvls/Simple"
};

// Where a group's ranks are: how many, on how many nodes, and the fewest of them on any
// one of those nodes.
struct Span {
  int ranks = 0;
  int nodes = 1;
  int per_node = 0;  // 0: ranks / nodes
};
// The span of a group whose global ranks are `members`, on nodes of `ranks_per_node` ranks
// each (a launch's LOCAL_WORLD_SIZE; 0 or less: one node).
Span span_of(const std::vector<int>& members, int ranks_per_node);

// The fastest algorithm's time for a message of `bytes` (nccl-tests' message size) on
// `ranks` ranks of one node; zero seconds on one rank (NCCL copies locally) or for an
// empty message of a transfer.
Prediction predict(const Platform& platform, Collective c, std::int64_t bytes, int ranks);
// The same for a group spread over nodes (NOTE [The network between nodes]). Throws
// ConfigError when the group spans nodes and the platform has no network.
Prediction predict(const Platform& platform, Collective c, std::int64_t bytes, const Span& span);
// Throws that ConfigError, where a program forms such a group.
void require_network(const Platform& platform, const Span& span);

// Throws ConfigError naming `origin` and what is wrong in it.
Platform parse_platform(std::string_view json, const std::string& origin);
std::string platform_json(const Platform& platform);  // what parse_platform reads back

// The folders searched for platform files, in order: SGPU_PLATFORM_PATH's (':'), the
// source tree's, the installed one.
std::vector<std::string> platform_path();
// A platform by name (a file <name>.json in the path) or by a path to a file (one with a
// '/' or ending in .json). Throws ConfigError naming what it looked for and the platforms
// there are.
Platform load_platform(std::string_view name_or_file);
// Every platform in the path, by name (the first of a name wins).
std::vector<std::string> platform_names();
// The platform whose default_for lists `gpu_type`; nullopt when none does.
std::optional<std::string> default_platform_for(std::string_view gpu_type);

// One row of a validation table: a published figure and the model's.
struct Check {
  Published published;
  Prediction predicted;
  double published_us = 0;  // the figure as a time (the range's middle for a range)
  // predicted / published time - 1; 0 inside a published range, else to its nearer end.
  double error = 0;
};
std::vector<Check> validate(const Platform& platform);

// A timing of one collective on a real node (a bench_collectives row).
struct Measurement {
  Collective op = Collective::kAllReduce;
  std::int64_t bytes = 0;
  int ranks = 0;
  double seconds = 0;
};
// A platform that reproduces the measurements: per op measured, one algorithm "fitted"
// whose latency is the smallest message's time and whose efficiency curve passes through
// every larger measured size; ops not measured keep `base`'s algorithms. Throws
// ConfigError for an op with no usable measurement (a time of zero or less).
Platform fit_platform(const Platform& base, const std::vector<Measurement>& measurements,
                      const std::string& name);

}  // namespace sgpu::model
