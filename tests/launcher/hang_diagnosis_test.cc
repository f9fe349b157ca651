// The collective ring as a file (what a rank writes, the caller reads back), and the
// verdict's laws over rings built by hand: a rank missing from collective #k, a rank that
// entered it with other arguments, every rank stuck alike, every rank outside.
#include "launcher/hang_diagnosis.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "contract/collective_ring.h"
#include "testing/temp_dir.h"

namespace {

using sgpu::contract::CollectiveEntry;
using sgpu::contract::CollectiveOp;
using sgpu::contract::EntryState;
using sgpu::contract::RingSnapshot;
using sgpu::launcher::Diagnosis;
using sgpu::launcher::RankView;

constexpr std::int64_t kSecond = 1'000'000'000;

CollectiveEntry all_reduce(std::uint64_t seq, EntryState state, std::int64_t count = 1024) {
  CollectiveEntry e;
  e.seq = seq;
  e.op = CollectiveOp::kAllReduce;
  e.dtype = "float32";
  e.reduce_op = "sum";
  e.numel_in = e.numel_out = count;
  e.bytes = count * 4;
  e.state = state;
  e.entered_ns = static_cast<std::int64_t>(seq) * kSecond;
  e.ended_ns = state == EntryState::kInFlight ? 0 : e.entered_ns + 1000;
  return e;
}

// `world` ranks that completed collectives 1..done; `open(rank)` adds what each is in.
template <class Open>
std::vector<RankView> ranks(int world, std::uint64_t done, Open open) {
  std::vector<RankView> views;
  for (int rank = 0; rank < world; ++rank) {
    RingSnapshot ring;
    ring.rank = rank;
    ring.world_size = world;
    ring.groups.push_back({"world", world, rank, {}});
    for (std::uint64_t seq = 1; seq <= done; ++seq) {
      ring.entries.push_back(all_reduce(seq, EntryState::kCompleted));
    }
    open(rank, ring.entries);
    views.push_back({rank, ring, ""});
  }
  return views;
}

const std::int64_t kNow = 1000 * kSecond;

RC_GTEST_PROP(Verdict, ARankMissingFromACollectiveIsNamed, ()) {
  const int world = *rc::gen::inRange(2, 9);
  const int missing = *rc::gen::inRange(0, world);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto views = ranks(world, done, [&](int rank, auto& entries) {
    if (rank != missing) entries.push_back(all_reduce(done + 1, EntryState::kInFlight));
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kMissing);
  RC_ASSERT(d.culprits == std::vector<int>{missing});
  RC_ASSERT(d.seq == done + 1);
  RC_ASSERT(d.verdict.rfind("rank " + std::to_string(missing) + " never entered collective #" +
                                std::to_string(done + 1),
                            0) == 0);
}

RC_GTEST_PROP(Verdict, ARankWithOtherArgumentsIsNamedAgainstTheOthers, ()) {
  const int world = *rc::gen::inRange(3, 9);
  const int odd = *rc::gen::inRange(0, world);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto views = ranks(world, done, [&](int rank, auto& entries) {
    entries.push_back(all_reduce(done + 1, EntryState::kInFlight, rank == odd ? 1025 : 1024));
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kMismatch);
  RC_ASSERT(d.culprits == std::vector<int>{odd});
  RC_ASSERT(d.verdict.find("rank " + std::to_string(odd) + " called all_reduce of 1025 float32") !=
            std::string::npos);
}

RC_GTEST_PROP(Verdict, EveryRankInTheSameCollectiveIsATransportStuck, ()) {
  const int world = *rc::gen::inRange(2, 9);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto views = ranks(world, done, [&](int, auto& entries) {
    entries.push_back(all_reduce(done + 1, EntryState::kInFlight));
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kStuck);
  RC_ASSERT(d.culprits.empty());
  RC_ASSERT(d.seq == done + 1);
}

RC_GTEST_PROP(Verdict, NoCollectiveInFlightIsEveryRankOutside, ()) {
  const int world = *rc::gen::inRange(1, 9);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto views = ranks(world, done, [](int, auto&) {});
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kOutside);
  RC_ASSERT(!sgpu::launcher::longest_in_flight(views).has_value());
}

RC_GTEST_PROP(Verdict, ACollectiveThatFailedOnARankNamesThatRank, ()) {
  const int world = *rc::gen::inRange(2, 9);
  const int failed = *rc::gen::inRange(0, world);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto views = ranks(world, done, [&](int rank, auto& entries) {
    entries.push_back(
        all_reduce(done + 1, rank == failed ? EntryState::kFailed : EntryState::kCompleted));
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kFailed);
  RC_ASSERT(d.culprits == std::vector<int>{failed});
  RC_ASSERT(d.seq == done + 1);
  RC_ASSERT(d.verdict == "collective #" + std::to_string(done + 1) +
                             " (all_reduce of 1024 float32 (sum)) failed on rank " +
                             std::to_string(failed) + ".");
}

// DDP leaves several asynchronous all-reduces in flight on a rank (its buckets): the verdict
// is about the lowest one still open, where the ranks part, not the newest.
RC_GTEST_PROP(Verdict, WithSeveralCollectivesInFlightTheFirstOpenOneIsJudged, ()) {
  const int world = *rc::gen::inRange(2, 9);
  const int missing = *rc::gen::inRange(0, world);
  const auto done = *rc::gen::inRange<std::uint64_t>(0, 20);
  const auto open = *rc::gen::inRange<std::uint64_t>(2, 6);  // buckets in flight
  const auto views = ranks(world, done, [&](int rank, auto& entries) {
    // The others have `open` buckets in flight; `missing` went on without any of them.
    if (rank == missing) return;
    for (std::uint64_t k = 1; k <= open; ++k) {
      entries.push_back(all_reduce(done + k, EntryState::kInFlight));
      entries.back().entered_ns += static_cast<std::int64_t>(k);  // queued one after another
    }
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  RC_ASSERT(d.kind == Diagnosis::Kind::kMissing);
  RC_ASSERT(d.culprits == std::vector<int>{missing});
  RC_ASSERT(d.seq == done + 1);
  RC_ASSERT(d.verdict.rfind("rank " + std::to_string(missing) + " never entered collective #" +
                                std::to_string(done + 1),
                            0) == 0);
}

TEST(Verdict, AMissingRankThatEndedSaysHow) {
  auto views = ranks(3, 2, [](int rank, auto& entries) {
    if (rank != 1) entries.push_back(all_reduce(3, EntryState::kInFlight));
  });
  views[1].end = "was killed by SIGSEGV";
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  EXPECT_NE(d.verdict.find("Rank 1's last collective there was #2 all_reduce of 1024 float32 "
                           "(sum), completed"),
            std::string::npos)
      << d.verdict;
  EXPECT_NE(d.verdict.find("it was killed by SIGSEGV."), std::string::npos) << d.verdict;
  EXPECT_NE(d.table.find("rank 1 (was killed by SIGSEGV): #1"), std::string::npos) << d.table;
}

// The missing rank stays the culprit; the collective is named as most called it, and the
// ranks that entered it and disagree are named too.
TEST(Verdict, AMissingRankBesideRanksThatDisagreeSaysBoth) {
  const auto views = ranks(4, 1, [](int rank, auto& entries) {
    if (rank != 3) entries.push_back(all_reduce(2, EntryState::kInFlight, rank == 0 ? 1025 : 1024));
  });
  const Diagnosis d = sgpu::launcher::diagnose(views, kNow);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kMissing);
  EXPECT_EQ(d.culprits, std::vector<int>{3});
  EXPECT_EQ(
      d.verdict.rfind("rank 3 never entered collective #2 (all_reduce of 1024 float32 (sum))", 0),
      0u)
      << d.verdict;
  EXPECT_NE(d.verdict.find(" The ranks in it disagree: rank 0 called all_reduce of 1025 float32 "
                           "(sum), ranks 1, 2 all_reduce of 1024 float32 (sum)."),
            std::string::npos)
      << d.verdict;
}

// A launch that sees ranks 0 and 1 of a world of 4 (another node's ranks, or those a folded
// world's ranks stand for, have no view here).
std::vector<RankView> half_of_four(bool rank_1_enters) {
  auto views = ranks(2, 1, [&](int rank, auto& entries) {
    if (rank == 0 || rank_1_enters) entries.push_back(all_reduce(2, EntryState::kInFlight));
  });
  for (RankView& view : views) view.ring->groups[0] = {"world", 4, view.rank, {0, 1, 2, 3}};
  return views;
}

TEST(Verdict, ARankWithNoViewHereIsNeverNamedMissing) {
  const Diagnosis d = sgpu::launcher::diagnose(half_of_four(false), kNow);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kMissing);
  EXPECT_EQ(d.culprits, std::vector<int>{1});
  EXPECT_EQ(d.verdict.rfind("rank 1 never entered collective #2", 0), 0u) << d.verdict;
  EXPECT_EQ(d.verdict.find("rank 2"), std::string::npos) << d.verdict;
}

TEST(Verdict, EveryRankSeenInTheCollectiveSaysWhoseRingsAreElsewhere) {
  const Diagnosis d = sgpu::launcher::diagnose(half_of_four(true), kNow);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kStuck);
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_NE(d.verdict.find("every rank seen here entered collective #2"), std::string::npos)
      << d.verdict;
  EXPECT_NE(
      d.verdict.find(
          "; ranks 2, 3 have no ring here (they run on other nodes, or a folded world's ranks "
          "stand for them)."),
      std::string::npos)
      << d.verdict;
}

TEST(Verdict, TheLongestInFlightIsTheOldestEntry) {
  auto views = ranks(3, 1, [](int rank, auto& entries) {
    entries.push_back(all_reduce(2, EntryState::kInFlight));
    entries.back().entered_ns += rank == 2 ? -5 : 7;
  });
  const auto longest = sgpu::launcher::longest_in_flight(views);
  ASSERT_TRUE(longest.has_value());
  EXPECT_EQ(longest->rank, 2);
  EXPECT_EQ(longest->since_ns, 2 * kSecond - 5);
}

TEST(CollectiveRing, KeepsTheNewestEntriesInOrderAndTheirEnds) {
  const auto dir = sgpu::testing::make_temp_dir("sgpu-ring");
  const auto file = dir / "collectives.ring";
  auto ring = sgpu::contract::CollectiveRing::create(file, 8, 3, 4);
  EXPECT_EQ(ring->add_group({"world", 4, 3, {0, 1, 2, 3}}), 0u);
  EXPECT_EQ(ring->add_group({"ranks 1,3", 2, 1, {1, 3}}), 1u);
  std::vector<std::uint64_t> serials;
  for (std::uint64_t seq = 1; seq <= 20; ++seq) {
    CollectiveEntry e = all_reduce(seq, EntryState::kInFlight, static_cast<std::int64_t>(seq));
    e.group = static_cast<std::uint32_t>(seq % 2);
    serials.push_back(ring->begin(e));
  }
  ring->end(serials[19], EntryState::kCompleted);
  ring->end(serials[18], EntryState::kFailed);
  ring->end(serials[0], EntryState::kCompleted);  // overwritten long ago: no effect
  const auto read = sgpu::contract::read_collective_ring(file);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->rank, 3);
  EXPECT_EQ(read->world_size, 4);
  EXPECT_EQ(read->written, 20u);
  ASSERT_EQ(read->groups.size(), 2u);
  EXPECT_EQ(read->groups[1].name, "ranks 1,3");
  EXPECT_EQ(read->groups[1].members, (std::vector<int>{1, 3}));
  ASSERT_EQ(read->entries.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    const CollectiveEntry& e = read->entries[i];
    EXPECT_EQ(e.seq, 13 + i);
    EXPECT_EQ(e.serial, 13 + i);
    EXPECT_EQ(e.numel_in, static_cast<std::int64_t>(13 + i));
    EXPECT_EQ(e.group, (13 + i) % 2);
    EXPECT_EQ(e.dtype, "float32");
    EXPECT_EQ(e.reduce_op, "sum");
  }
  EXPECT_EQ(read->entries[7].state, EntryState::kCompleted);
  EXPECT_GT(read->entries[7].ended_ns, 0);
  EXPECT_EQ(read->entries[6].state, EntryState::kFailed);
  EXPECT_EQ(read->entries[5].state, EntryState::kInFlight);
  EXPECT_FALSE(sgpu::contract::read_collective_ring(dir / "absent").has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
