// The volume dataset: the partitioning law (every file once per epoch across ranks and
// workers, or the stated padding), order independent of read-ahead timing, exact resume
// from a saved state, the local cache (LRU eviction, stale copies fetched again), and an
// epoch read by 3 simulated ranks of 2 workers each.
#include "sgpu/data/volume_dataset.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

namespace {

namespace fs = std::filesystem;
using namespace sgpu::data;

fs::path temp_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("sgpu-data-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// n files in nested folders, plus one the glob leaves out.
fs::path make_volume(const std::string& name, int n) {
  const fs::path root = temp_dir(name);
  for (int i = 0; i < n; ++i) {
    write(root / ("part-" + std::to_string(i % 3)) / ("f" + std::to_string(i) + ".bin"),
          "file " + std::to_string(i));
  }
  write(root / "README.txt", "not data");
  return root;
}

Balance any_balance() {
  return *rc::gen::element(Balance::kPad, Balance::kDropTail, Balance::kNone);
}

RC_GTEST_PROP(VolumeDataset, EveryFileOncePerEpochAcrossRanksAndWorkersOrTheStatedPadding, ()) {
  const std::int64_t n = *rc::gen::inRange<std::int64_t>(0, 80);
  const int world = *rc::gen::inRange(1, 9), workers = *rc::gen::inRange(1, 5);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const std::int64_t epoch = *rc::gen::inRange<std::int64_t>(0, 1000);
  const bool shuffle = *rc::gen::arbitrary<bool>();
  const Balance balance = any_balance();
  std::map<std::int64_t, int> seen;
  std::vector<std::int64_t> per_rank(world);
  for (int r = 0; r < world; ++r) {
    for (int k = 0; k < workers; ++k) {
      const auto part = partition(n, seed, epoch, shuffle, balance, r, world, k, workers);
      RC_ASSERT(part == partition(n, seed, epoch, shuffle, balance, r, world, k, workers));
      per_rank[r] += static_cast<std::int64_t>(part.size());
      for (const auto i : part) {
        RC_ASSERT(i >= 0 && i < n);
        ++seen[i];
      }
    }
  }
  std::int64_t total = 0;
  for (const auto& [i, count] : seen) total += count;
  if (balance == Balance::kNone) {
    RC_ASSERT(static_cast<std::int64_t>(seen.size()) == n);
    for (const auto& [i, count] : seen) RC_ASSERT(count == 1);
    for (const auto c : per_rank) RC_ASSERT(c == n / world || c == n / world + 1);
  } else if (balance == Balance::kDropTail) {
    RC_ASSERT(total == n / world * world);
    for (const auto& [i, count] : seen) RC_ASSERT(count == 1);
    for (const auto c : per_rank) RC_ASSERT(c == n / world);
  } else {
    const std::int64_t per = (n + world - 1) / world;
    RC_ASSERT(total == per * world);
    RC_ASSERT(static_cast<std::int64_t>(seen.size()) == n);
    for (const auto& [i, count] : seen)
      RC_ASSERT(count >= 1 && count <= (world + n - 1) / std::max<std::int64_t>(n, 1) + 1);
    for (const auto c : per_rank) RC_ASSERT(c == per);
  }
}

std::vector<std::string> drain(Stream& stream, std::int64_t limit = -1) {
  std::vector<std::string> out;
  while (limit < 0 || static_cast<std::int64_t>(out.size()) < limit) {
    auto item = stream.next();
    if (!item) break;
    RC_ASSERT(fs::exists(item->local_path));
    out.push_back(item->path);
  }
  return out;
}

RC_GTEST_PROP(VolumeDataset, AResumeAtAnyPointContinuesTheSameSequenceWhateverTheReadAhead, ()) {
  const int n = *rc::gen::inRange(0, 25);
  const fs::path root = make_volume("resume", n);
  VolumeDatasetOptions o{
      .root = root, .glob = "*.bin", .seed = *rc::gen::arbitrary<std::uint64_t>()};
  o.world_size = *rc::gen::inRange(1, 4);
  o.rank = *rc::gen::inRange(0, o.world_size);
  o.num_workers = *rc::gen::inRange(1, 3);
  o.balance = any_balance();
  o.read_ahead = *rc::gen::inRange(0, 5);
  if (*rc::gen::arbitrary<bool>()) o.cache_dir = temp_dir("resume-cache");
  const int worker = *rc::gen::inRange(0, o.num_workers);
  const std::int64_t epoch = *rc::gen::inRange(0, 5);

  VolumeDataset dataset(o);
  RC_ASSERT(static_cast<int>(dataset.files().size()) == n);
  Stream whole = dataset.stream(worker);
  whole.set_epoch(epoch);
  const auto expected = drain(whole);
  std::vector<std::string> by_law;
  for (const auto i :
       partition(n, o.seed, epoch, true, o.balance, o.rank, o.world_size, worker, o.num_workers)) {
    by_law.push_back(dataset.files()[static_cast<std::size_t>(i)]);
  }
  RC_ASSERT(expected == by_law);

  const std::int64_t cut =
      *rc::gen::inRange<std::int64_t>(0, static_cast<std::int64_t>(expected.size()) + 1);
  Stream first = dataset.stream(worker);
  first.set_epoch(epoch);
  auto got = drain(first, cut);
  const std::string saved = first.state().to_json();
  o.read_ahead = *rc::gen::inRange(0, 5);
  VolumeDataset restarted(o);
  Stream second = restarted.stream(worker);
  second.restore(StreamState::from_json(saved));
  const auto rest = drain(second);
  got.insert(got.end(), rest.begin(), rest.end());
  RC_ASSERT(got == expected);
}

TEST(VolumeDataset, CacheEvictsLeastRecentlyUsedAndFetchesChangedFilesAgain) {
  const fs::path root = temp_dir("cache-volume"), cache_dir = temp_dir("cache");
  for (int i = 0; i < 4; ++i)
    write(root / ("f" + std::to_string(i)), std::string(100, static_cast<char>('a' + i)));
  write(root / "big", std::string(1000, 'z'));
  FileCache cache(cache_dir, 250);  // room for two files of 100 bytes
  EXPECT_EQ(cache.fetch(root, "f0"), cache_dir / "f0");
  cache.fetch(root, "f1");
  cache.fetch(root, "f0");  // f1 is now the least recently used
  cache.fetch(root, "f2");
  EXPECT_TRUE(fs::exists(cache_dir / "f0"));
  EXPECT_FALSE(fs::exists(cache_dir / "f1"));
  EXPECT_TRUE(fs::exists(cache_dir / "f2"));
  EXPECT_EQ(cache.bytes(), 200u);
  EXPECT_EQ(cache.fetches(), 3u);
  EXPECT_EQ(cache.evictions(), 1u);
  // Larger than the whole cache: read in place.
  EXPECT_EQ(cache.fetch(root, "big"), root / "big");
  // A changed source (same size, new content and time) is fetched again.
  write(root / "f0", std::string(100, 'Q'));
  const auto later = fs::last_write_time(root / "f0") + std::chrono::seconds(5);
  fs::last_write_time(root / "f0", later);
  const fs::path local = cache.fetch(root, "f0");
  std::ifstream in(local);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), std::string(100, 'Q'));
  EXPECT_EQ(cache.fetches(), 4u);
  // An unchanged one is not.
  cache.fetch(root, "f0");
  EXPECT_EQ(cache.fetches(), 4u);
  // A new process finds the copies already there.
  FileCache again(cache_dir, 250);
  EXPECT_EQ(again.bytes(), 200u);
  again.fetch(root, "f2");
  EXPECT_EQ(again.fetches(), 0u);
}

TEST(VolumeDataset, YieldsBytesAndRefusesBadOptions) {
  const fs::path root = make_volume("bytes", 5);
  VolumeDataset dataset({.root = root, .glob = "*.bin", .seed = 3, .load_bytes = true});
  Stream stream = dataset.stream(0);
  int count = 0;
  while (auto item = stream.next()) {
    std::ifstream in(root / item->path, std::ios::binary);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(std::string(item->bytes.begin(), item->bytes.end()), text);
    ++count;
  }
  EXPECT_EQ(count, 5);
  EXPECT_THROW(VolumeDataset({.root = root / "absent"}), sgpu::ConfigError);
  EXPECT_THROW(VolumeDataset({.root = root, .rank = 3, .world_size = 2}), sgpu::ConfigError);
  EXPECT_THROW(dataset.stream(1), sgpu::ConfigError);
  StreamState other = stream.state();
  other.seed = 4;
  EXPECT_THROW(stream.restore(other), sgpu::ConfigError);
  EXPECT_THROW(StreamState::from_json("{"), sgpu::ConfigError);
}

// In each rank: two worker threads read one epoch through a per-rank cache.
std::vector<std::string> read_epoch(std::string root, std::string cache, int epoch) {
  VolumeDataset dataset({.root = root,
                         .glob = "*.bin",
                         .seed = 99,
                         .balance = Balance::kNone,
                         .num_workers = 2,
                         .cache_dir = cache});
  std::vector<std::string> parts[2];
  std::vector<std::thread> workers;
  for (int k = 0; k < 2; ++k) {
    workers.emplace_back([&, k] {
      Stream stream = dataset.stream(k);
      stream.set_epoch(epoch);
      while (auto item = stream.next()) parts[k].push_back(item->path);
    });
  }
  for (auto& w : workers) w.join();
  parts[0].insert(parts[0].end(), parts[1].begin(), parts[1].end());
  return parts[0];
}

TEST(VolumeDataset, ThreeRanksOfTwoWorkersReadEveryFileOncePerEpoch) {
  const fs::path root = make_volume("ranks", 31), cache = temp_dir("ranks-cache");
  sgpu::Options options = sgpu::testing::sim(3, true);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto results =
        sgpu::distributed(read_epoch, options).distributed(root.string(), cache.string(), epoch);
    std::vector<std::string> all;
    for (const auto& r : results) all.insert(all.end(), r.begin(), r.end());
    std::sort(all.begin(), all.end());
    VolumeDataset dataset({.root = root, .glob = "*.bin"});
    EXPECT_EQ(all, dataset.files()) << "epoch " << epoch;
    EXPECT_TRUE(fs::exists(cache / "rank-2"));
  }
}

}  // namespace
