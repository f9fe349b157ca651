// Streaming files from a volume (any directory: a network mount in production, a local
// folder in tests), partitioned across ranks and loader workers, cached locally.
//
//   sgpu::data::VolumeDataset dataset({.root = "/vol/train", .glob = "*.bin", .seed = 7,
//                                      .cache_dir = "/tmp/cache", .num_workers = 2});
//   auto stream = dataset.stream(/*worker=*/0);   // inside a rank; one per loader worker
//   stream.set_epoch(epoch);
//   while (auto item = stream.next()) use(item->local_path);   // or item->bytes
//
// The files under root that match the glob (fnmatch on the path relative to root, where
// '*' also crosses '/') are listed once, sorted by that path, so every rank sees the same
// list. Each epoch orders them by a permutation drawn from (seed, epoch) alone. Rank r of
// W takes positions r, r + W, r + 2W, ... of that order, and worker k of K of a rank
// takes positions k, k + K, ... of the rank's part: across all ranks and workers every
// file is read exactly once per epoch. With Balance::kPad (the default, as PyTorch's
// DistributedSampler) the order is first extended by repeating its beginning until its
// length is a multiple of W, so every rank has the same number of items; kDropTail cuts
// it to a multiple of W instead; kNone leaves ranks uneven.
//
// With a cache folder, each file is copied there on first read (to a temporary name, then
// renamed) and read from there afterwards; a cached copy whose size or modification time
// differs from the source is fetched again; when the cached bytes would pass cache_bytes
// the least recently used copies are removed (a file larger than the whole cache is read
// from the volume directly). One cache folder per process: a dataset inside a rank uses
// cache_dir/rank-N. A stream reads up to read_ahead items ahead in background threads;
// items come back in their order whatever the timing.
//
// A stream's state (seed, epoch, worker, items consumed) can be saved and restored; the
// restored stream continues with the next item of the same sequence.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sgpu::data {

enum class Balance {
  kPad,       // every rank gets ceil(N / W) items, repeating the epoch's first files
  kDropTail,  // every rank gets floor(N / W) items, the epoch's last N mod W are skipped
  kNone,      // rank r gets the files at r, r + W, ...: counts differ by at most one
};

struct VolumeDatasetOptions {
  std::filesystem::path root;
  std::string glob;  // empty: every regular file
  std::uint64_t seed = 0;
  bool shuffle = true;
  Balance balance = Balance::kPad;
  int rank = -1;                    // -1: sgpu::global_rank() inside a rank, else 0
  int world_size = -1;              // -1: sgpu::world_size() inside a rank, else 1
  int num_workers = 1;              // loader workers per rank
  std::filesystem::path cache_dir;  // empty: read from the volume directly
  std::uint64_t cache_bytes = std::uint64_t{10} << 30;
  int read_ahead = 4;       // items fetched ahead in the background; 0: none
  bool load_bytes = false;  // also read each item's bytes into Item::bytes
};

struct Item {
  std::string path;                  // relative to the root
  std::filesystem::path local_path;  // the cached copy, or the file on the volume
  std::vector<std::uint8_t> bytes;   // with load_bytes
  std::int64_t position = 0;         // in the stream's part of the epoch
};

// Where a stream is; what a restarted run restores.
struct StreamState {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  int worker = 0;
  std::int64_t consumed = 0;
  std::string to_json() const;
  static StreamState from_json(const std::string& json);  // sgpu::ConfigError if malformed
};

// The epoch's part of one (rank, worker): indices into the sorted file list. The whole
// partitioning law, free of files and timing.
std::vector<std::int64_t> partition(std::int64_t file_count, std::uint64_t seed, std::int64_t epoch,
                                    bool shuffle, Balance balance, int rank, int world_size,
                                    int worker, int num_workers);

// A local cache folder with a size limit and least-recently-used eviction. Thread-safe.
class FileCache {
 public:
  FileCache(std::filesystem::path dir, std::uint64_t limit_bytes);
  // The local copy of root/relative, fetched when absent or stale.
  std::filesystem::path fetch(const std::filesystem::path& root, const std::string& relative);
  std::uint64_t bytes() const;
  std::uint64_t fetches() const;  // copies made from the volume
  std::uint64_t evictions() const;

 private:
  struct Entry {
    std::uint64_t size = 0;
    std::list<std::string>::iterator lru;
  };
  void evict_for(std::uint64_t incoming, const std::string& keep);

  std::filesystem::path dir_;
  std::uint64_t limit_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // front: most recent
  std::uint64_t bytes_ = 0, fetches_ = 0, evictions_ = 0;
};

class VolumeDataset;

// One (rank, worker)'s items of an epoch, in order.
class Stream {
 public:
  Stream(const VolumeDataset& dataset, int worker);
  ~Stream();
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;

  void set_epoch(std::int64_t epoch);  // starts the epoch from its first item
  std::optional<Item> next();          // nullopt at the end of the epoch
  std::int64_t size() const { return static_cast<std::int64_t>(part_->size()); }
  StreamState state() const;
  void restore(const StreamState& state);  // ConfigError if the seed or worker differ

 private:
  void refill();

  const VolumeDataset* dataset_;
  int worker_;
  std::int64_t epoch_ = 0;
  std::int64_t consumed_ = 0;
  // Shared with the fetches in flight, which outlive a move of the stream.
  std::shared_ptr<const std::vector<std::int64_t>> part_;
  std::deque<std::future<Item>> ahead_;  // items consumed_, consumed_ + 1, ...
};

class VolumeDataset {
 public:
  explicit VolumeDataset(VolumeDatasetOptions options);
  const std::vector<std::string>& files() const { return files_; }
  const VolumeDatasetOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Stream stream(int worker) const { return Stream(*this, worker); }
  FileCache* cache() const { return cache_.get(); }

 private:
  VolumeDatasetOptions options_;
  int rank_ = 0, world_size_ = 1;
  std::vector<std::string> files_;
  std::unique_ptr<FileCache> cache_;
};

}  // namespace sgpu::data
