#include "sgpu/data/volume_dataset.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "contract/atomic_file.h"
#include "sgpu/errors.h"
#include "sgpu/runtime.h"

namespace sgpu::data {
namespace {

namespace fs = std::filesystem;

// std::shuffle and the standard distributions differ between library implementations;
// the order must not, so Fisher-Yates over mt19937_64 (fully specified) is spelled out.
std::vector<std::int64_t> order(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                                bool shuffle) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
  if (!shuffle) return out;
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32)};
  std::mt19937_64 engine(seq);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(engine() % static_cast<std::uint64_t>(i + 1));
    std::swap(out[static_cast<std::size_t>(i)], out[static_cast<std::size_t>(j)]);
  }
  return out;
}

std::vector<std::uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), {}};
}

Item fetch(const VolumeDataset& dataset, const std::vector<std::int64_t>& part,
           std::int64_t position) {
  const auto& o = dataset.options();
  Item item;
  item.position = position;
  item.path = dataset.files()[static_cast<std::size_t>(part[static_cast<std::size_t>(position)])];
  item.local_path =
      dataset.cache() ? dataset.cache()->fetch(o.root, item.path) : o.root / item.path;
  if (o.load_bytes) item.bytes = read_file(item.local_path);
  return item;
}

}  // namespace

std::vector<std::int64_t> partition(std::int64_t file_count, std::uint64_t seed, std::int64_t epoch,
                                    bool shuffle, Balance balance, int rank, int world_size,
                                    int worker, int num_workers) {
  std::vector<std::int64_t> all = order(file_count, seed, epoch, shuffle);
  const std::int64_t world = world_size;
  if (balance == Balance::kPad && file_count > 0) {
    const std::int64_t total = (file_count + world - 1) / world * world;
    for (std::int64_t i = file_count; i < total; ++i)
      all.push_back(all[static_cast<std::size_t>(i % file_count)]);
  } else if (balance == Balance::kDropTail) {
    all.resize(static_cast<std::size_t>(file_count / world * world));
  }
  std::vector<std::int64_t> mine;
  std::int64_t k = 0;  // position in the rank's part
  for (std::size_t i = static_cast<std::size_t>(rank); i < all.size();
       i += static_cast<std::size_t>(world), ++k) {
    if (k % num_workers == worker) mine.push_back(all[i]);
  }
  return mine;
}

std::string StreamState::to_json() const {
  return nlohmann::json{
      {"seed", seed}, {"epoch", epoch}, {"worker", worker}, {"consumed", consumed}}
      .dump();
}

StreamState StreamState::from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    return {j.at("seed").get<std::uint64_t>(), j.at("epoch").get<std::int64_t>(),
            j.at("worker").get<int>(), j.at("consumed").get<std::int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("dataset stream state is malformed (" + std::string(e.what()) +
                      "); pass what StreamState::to_json() wrote");
  }
}

FileCache::FileCache(fs::path dir, std::uint64_t limit_bytes)
    : dir_(std::move(dir)), limit_(limit_bytes) {
  fs::create_directories(dir_);
  // Copies left by an earlier process count as least recently used; half-written ones go.
  for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind(".fetch-", 0) == 0) {
      fs::remove(entry.path());
      continue;
    }
    const std::string key = fs::relative(entry.path(), dir_).string();
    lru_.push_back(key);
    entries_[key] = {entry.file_size(), std::prev(lru_.end())};
    bytes_ += entry.file_size();
  }
}

void FileCache::evict_for(std::uint64_t incoming, const std::string& keep) {
  while (bytes_ + incoming > limit_ && !lru_.empty()) {
    const std::string victim = lru_.back();
    if (victim == keep) break;
    fs::remove(dir_ / victim);
    bytes_ -= entries_.at(victim).size;
    entries_.erase(victim);
    lru_.pop_back();
    ++evictions_;
  }
}

fs::path FileCache::fetch(const fs::path& root, const std::string& relative) {
  const fs::path source = root / relative;
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) {
    throw Error("dataset file " + source.string() +
                " cannot be read: it was removed or is unreadable");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const fs::path local = dir_ / relative;
  std::lock_guard lock(mutex_);
  const auto found = entries_.find(relative);
  if (found != entries_.end()) {
    struct stat cached {};
    const bool fresh = ::stat(local.c_str(), &cached) == 0 && cached.st_size == st.st_size &&
                       cached.st_mtim.tv_sec == st.st_mtim.tv_sec &&
                       cached.st_mtim.tv_nsec == st.st_mtim.tv_nsec;
    if (fresh) {
      lru_.splice(lru_.begin(), lru_, found->second.lru);
      return local;
    }
    fs::remove(local);
    bytes_ -= found->second.size;
    lru_.erase(found->second.lru);
    entries_.erase(found);
  }
  if (size > limit_) return source;  // larger than the whole cache: read in place
  evict_for(size, relative);
  fs::create_directories(local.parent_path());
  // Another worker reading the cache sees the whole copy or none (contract/atomic_file.h).
  const fs::path temp = contract::sibling_for_writing(local);
  fs::copy_file(source, temp, fs::copy_options::overwrite_existing);
  // The copy carries the source's modification time: that and the size tell staleness.
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ::utimensat(AT_FDCWD, temp.c_str(), times, 0);
  contract::publish_file(temp, local, contract::Durability::kAtomic);
  lru_.push_front(relative);
  entries_[relative] = {size, lru_.begin()};
  bytes_ += size;
  ++fetches_;
  return local;
}

std::uint64_t FileCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}
std::uint64_t FileCache::fetches() const {
  std::lock_guard lock(mutex_);
  return fetches_;
}
std::uint64_t FileCache::evictions() const {
  std::lock_guard lock(mutex_);
  return evictions_;
}

VolumeDataset::VolumeDataset(VolumeDatasetOptions options) : options_(std::move(options)) {
  rank_ = options_.rank >= 0 ? options_.rank : (sgpu::is_rank() ? sgpu::global_rank() : 0);
  world_size_ =
      options_.world_size >= 0 ? options_.world_size : (sgpu::is_rank() ? sgpu::world_size() : 1);
  if (world_size_ < 1 || rank_ >= world_size_) {
    throw ConfigError("dataset rank " + std::to_string(rank_) + " of world size " +
                      std::to_string(world_size_) +
                      " is out of range; leave rank and world_size unset inside a rank");
  }
  if (options_.num_workers < 1) {
    throw ConfigError("dataset num_workers is " + std::to_string(options_.num_workers) +
                      "; it must be 1 or more");
  }
  if (!fs::is_directory(options_.root)) {
    throw ConfigError("dataset root " + options_.root.string() + " is not a directory (rank " +
                      std::to_string(rank_) + "); check the volume is mounted and the path");
  }
  for (const auto& entry : fs::recursive_directory_iterator(options_.root)) {
    if (!entry.is_regular_file()) continue;
    const std::string relative = fs::relative(entry.path(), options_.root).string();
    if (options_.glob.empty() || ::fnmatch(options_.glob.c_str(), relative.c_str(), 0) == 0) {
      files_.push_back(relative);
    }
  }
  std::sort(files_.begin(), files_.end());
  if (!options_.cache_dir.empty()) {
    const fs::path dir = sgpu::is_rank() ? options_.cache_dir / ("rank-" + std::to_string(rank_))
                                         : options_.cache_dir;
    cache_ = std::make_unique<FileCache>(dir, options_.cache_bytes);
  }
}

Stream::Stream(const VolumeDataset& dataset, int worker) : dataset_(&dataset), worker_(worker) {
  if (worker < 0 || worker >= dataset.options().num_workers) {
    throw ConfigError("dataset worker " + std::to_string(worker) +
                      " is out of range: num_workers is " +
                      std::to_string(dataset.options().num_workers));
  }
  set_epoch(0);
}

Stream::~Stream() = default;
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;

void Stream::set_epoch(std::int64_t epoch) {
  ahead_.clear();  // waits for fetches in flight
  epoch_ = epoch;
  consumed_ = 0;
  const auto& o = dataset_->options();
  part_ = std::make_shared<const std::vector<std::int64_t>>(
      partition(static_cast<std::int64_t>(dataset_->files().size()), o.seed, epoch, o.shuffle,
                o.balance, dataset_->rank(), dataset_->world_size(), worker_, o.num_workers));
}

void Stream::refill() {
  const std::int64_t want = std::max(1, dataset_->options().read_ahead + 1);
  while (static_cast<std::int64_t>(ahead_.size()) < want &&
         consumed_ + static_cast<std::int64_t>(ahead_.size()) < size()) {
    const std::int64_t position = consumed_ + static_cast<std::int64_t>(ahead_.size());
    const auto policy =
        dataset_->options().read_ahead == 0 ? std::launch::deferred : std::launch::async;
    ahead_.push_back(std::async(policy, [dataset = dataset_, part = part_, position] {
      return fetch(*dataset, *part, position);
    }));
  }
}

std::optional<Item> Stream::next() {
  if (consumed_ >= size()) return std::nullopt;
  refill();
  Item item = ahead_.front().get();
  ahead_.pop_front();
  ++consumed_;
  // A copy fetched ahead may have been evicted since by a small cache: fetch it again.
  if (dataset_->cache() && !dataset_->options().load_bytes &&
      !std::filesystem::exists(item.local_path)) {
    item = fetch(*dataset_, *part_, item.position);
  }
  refill();
  return item;
}

StreamState Stream::state() const { return {dataset_->options().seed, epoch_, worker_, consumed_}; }

void Stream::restore(const StreamState& state) {
  if (state.seed != dataset_->options().seed || state.worker != worker_) {
    throw ConfigError("dataset stream state is for seed " + std::to_string(state.seed) +
                      ", worker " + std::to_string(state.worker) + " but this stream has seed " +
                      std::to_string(dataset_->options().seed) + ", worker " +
                      std::to_string(worker_) +
                      "; restore each worker's own state into a dataset with the same seed");
  }
  set_epoch(state.epoch);
  consumed_ = std::clamp<std::int64_t>(state.consumed, 0, size());
}

}  // namespace sgpu::data
