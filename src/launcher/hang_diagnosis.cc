#include "launcher/hang_diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

namespace sgpu::launcher {
namespace {

using contract::CollectiveEntry;
using contract::EntryState;

std::string list_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return text;
}

std::string capitalized(std::string text) {
  if (!text.empty() && text[0] >= 'a' && text[0] <= 'z') text[0] = static_cast<char>(text[0] - 32);
  return text;
}

// "all_reduce of 1024 float32 (sum)", "broadcast from rank 0 of 10 int64", "barrier".
std::string describe_call(const CollectiveEntry& e) {
  std::string text(contract::op_name(e.op));
  if (e.peer >= 0) {
    text += e.op == contract::CollectiveOp::kSend     ? " to rank "
            : contract::is_point_to_point(e.op)       ? " from rank "
            : e.op == contract::CollectiveOp::kGather ? " to rank "
                                                      : " from rank ";
    text += std::to_string(e.peer);
  }
  if (!e.dtype.empty()) {
    const std::int64_t count = e.numel_in != 0 ? e.numel_in : e.numel_out;
    text += " of " + std::to_string(count) + " " + e.dtype;
    if (e.numel_in != 0 && e.numel_out != 0 && e.numel_out != e.numel_in) {
      text += " into " + std::to_string(e.numel_out);
    }
  }
  if (!e.reduce_op.empty()) text += " (" + e.reduce_op + ")";
  return text;
}

// What two ranks must agree on at one sequence number.
auto signature(const CollectiveEntry& e) {
  return std::make_tuple(e.op, e.dtype, e.numel_in, e.numel_out, e.reduce_op, e.peer);
}

struct Member {
  int rank = 0;
  const RankView* view = nullptr;               // none for a rank not launched here
  std::vector<const CollectiveEntry*> entries;  // the group's collectives, by seq
};

struct Group {
  std::string name;
  std::vector<Member> members;
};

const std::string& group_name(const contract::RingSnapshot& ring, const CollectiveEntry& e) {
  static const std::string unknown = "(unknown group)";
  return e.group < ring.groups.size() ? ring.groups[e.group].name : unknown;
}

// Every process group some rank recorded, with its members' collectives.
std::vector<Group> groups_of(const std::vector<RankView>& ranks) {
  std::vector<Group> groups;
  for (const auto& [name, global] : recorded_groups(ranks)) {
    Group group{name, {}};
    for (int rank : global) {
      Member member;
      member.rank = rank;
      for (const RankView& view : ranks) {
        if (view.rank == rank) member.view = &view;
      }
      if (member.view != nullptr && member.view->ring) {
        for (const CollectiveEntry& e : member.view->ring->entries) {
          if (!contract::is_point_to_point(e.op) && group_name(*member.view->ring, e) == name) {
            member.entries.push_back(&e);
          }
        }
        std::sort(member.entries.begin(), member.entries.end(),
                  [](auto* a, auto* b) { return a->seq < b->seq; });
      }
      group.members.push_back(std::move(member));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

const CollectiveEntry* at_seq(const Member& member, std::uint64_t seq) {
  for (const CollectiveEntry* e : member.entries) {
    if (e->seq == seq) return e;
  }
  return nullptr;
}

std::string where(const Group& group) {
  return group.name == "world" ? "" : " of process group " + group.name;
}

std::string ended(const Member& member) {
  if (member.view == nullptr || member.view->end.empty()) return "";
  return "; it " + member.view->end;
}

// Where each member of `group` is for collective #seq.
struct Attendance {
  std::vector<int> missing;  // never entered it
  std::vector<int> in_it;    // in flight in it
  std::vector<int> unseen;   // no view here: another node's, or one a folded world's stand for
  std::int64_t waited_since = 0;
};

Attendance attendance(const Group& group, std::uint64_t seq, std::int64_t now_ns) {
  Attendance a;
  a.waited_since = now_ns;
  for (const Member& m : group.members) {
    if (m.view == nullptr) {
      a.unseen.push_back(m.rank);
      continue;
    }
    const std::uint64_t entered = m.entries.empty() ? 0 : m.entries.back()->seq;
    if (entered < seq) {
      a.missing.push_back(m.rank);
      continue;
    }
    if (const CollectiveEntry* e = at_seq(m, seq)) {
      if (e->state == EntryState::kInFlight) {
        a.in_it.push_back(m.rank);
        a.waited_since = std::min(a.waited_since, e->entered_ns);
      }
    }
  }
  return a;
}

// " Rank 2's last collective there was #2 all_reduce(...), completed 3 s ago." for each
// member that never entered the collective.
std::string last_collectives(const Group& group, const std::vector<int>& missing,
                             std::int64_t now_ns) {
  std::string text;
  for (const Member& m : group.members) {
    if (std::find(missing.begin(), missing.end(), m.rank) == missing.end()) continue;
    text += " " + capitalized(list_ranks({m.rank}));
    if (m.entries.empty()) {
      text += " made no collective there";
    } else {
      const CollectiveEntry& last = *m.entries.back();
      text += "'s last collective there was #" + std::to_string(last.seq) + " " +
              describe_call(last) + ", " + std::string(contract::state_name(last.state));
      if (last.state != EntryState::kInFlight && last.ended_ns != 0) {
        text += " " + describe_duration(now_ns - last.ended_ns) + " ago";
      }
    }
    text += ended(m) + ".";
  }
  return text;
}

// The members that entered collective #seq, grouped by what they called it with, the
// largest group first; one group when they agree.
using Callers = std::vector<std::pair<const CollectiveEntry*, std::vector<int>>>;

Callers callers(const Group& group, std::uint64_t seq) {
  Callers kinds;
  for (const Member& m : group.members) {
    const CollectiveEntry* e = at_seq(m, seq);
    if (e == nullptr) continue;  // overwritten in its ring: nothing to compare
    auto same = std::find_if(kinds.begin(), kinds.end(),
                             [&](const auto& k) { return signature(*k.first) == signature(*e); });
    if (same == kinds.end()) {
      kinds.push_back({e, {m.rank}});
    } else {
      same->second.push_back(m.rank);
    }
  }
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return kinds;
}

// "rank 3 called all_gather of 1025 float32, the others (ranks 0, 1, 2) all_gather of 1024
// float32." for members that disagree; the culprits are all but the largest group's.
std::string disagreement(const Callers& kinds, std::vector<int>& culprits) {
  std::string text;
  const bool tie = kinds[0].second.size() == kinds[1].second.size();
  for (std::size_t i = 1; i < kinds.size(); ++i) {
    culprits.insert(culprits.end(), kinds[i].second.begin(), kinds[i].second.end());
    text += list_ranks(kinds[i].second) + " called " + describe_call(*kinds[i].first) + ", ";
  }
  std::sort(culprits.begin(), culprits.end());
  return text +
         (tie || kinds[0].second.size() < 3 ? list_ranks(kinds[0].second)
                                            : "the others (" + list_ranks(kinds[0].second) + ")") +
         " " + describe_call(*kinds[0].first) + ".";
}

// The verdict for one group waiting on collective #seq.
Diagnosis judge(const Group& group, std::uint64_t seq, std::int64_t now_ns) {
  Diagnosis d;
  d.group = group.name;
  d.seq = seq;
  const std::string number = "#" + std::to_string(seq);
  const Attendance a = attendance(group, seq, now_ns);
  const Callers kinds = callers(group, seq);
  // What most of the members that entered it called it with.
  const std::string what = !kinds.empty() ? describe_call(*kinds[0].first) : "collective";
  const std::string waited = describe_duration(now_ns - a.waited_since);
  if (!a.missing.empty()) {
    d.kind = Diagnosis::Kind::kMissing;
    d.culprits = a.missing;
    d.verdict = list_ranks(a.missing) + " never entered collective " + number + where(group) +
                " (" + what + ")";
    if (!a.in_it.empty()) {
      d.verdict += ": " + list_ranks(a.in_it) + (a.in_it.size() == 1 ? " has" : " have") +
                   " waited in it for " + waited;
    }
    d.verdict += "." + last_collectives(group, a.missing, now_ns);
    if (kinds.size() > 1) {
      std::vector<int> odd;  // the missing ones stay the culprits
      d.verdict += " The ranks in it disagree: " + disagreement(kinds, odd);
    }
    return d;
  }
  // Every member entered it: do they agree on what it is?
  if (kinds.size() > 1) {
    d.kind = Diagnosis::Kind::kMismatch;
    d.verdict = "the ranks disagree on collective " + number + where(group) + ": " +
                disagreement(kinds, d.culprits);
    return d;
  }
  std::vector<int> failed;
  for (const Member& m : group.members) {
    const CollectiveEntry* e = at_seq(m, seq);
    if (e != nullptr && e->state == EntryState::kFailed) failed.push_back(m.rank);
  }
  if (!failed.empty()) {
    d.kind = Diagnosis::Kind::kFailed;
    d.culprits = failed;
    d.verdict =
        "collective " + number + where(group) + " (" + what + ") failed on " + list_ranks(failed);
    if (!a.in_it.empty()) d.verdict += "; " + list_ranks(a.in_it) + " still wait in it";
    d.verdict += ".";
    return d;
  }
  d.kind = Diagnosis::Kind::kStuck;
  const bool seen_only = !a.unseen.empty();
  d.verdict = "every rank" + where(group) + (seen_only ? " seen here" : "") +
              " entered collective " + number + " (" + what +
              ") with the same arguments, and it has not completed on " + list_ranks(a.in_it) +
              " after " + waited;
  d.verdict += seen_only ? "; " + list_ranks(a.unseen) + (a.unseen.size() == 1 ? " has" : " have") +
                               " no ring here (they run on other nodes, or a folded world's ranks "
                               "stand for them)."
                         : ": the transport is stuck.";
  return d;
}

std::string table_of(const std::vector<RankView>& ranks, std::int64_t now_ns, int depth) {
  std::string table = "each rank's last collectives, newest last:\n";
  for (const RankView& view : ranks) {
    std::string head = "  rank " + std::to_string(view.rank);
    if (!view.end.empty()) head += " (" + view.end + ")";
    head += ": ";
    if (!view.ring || view.ring->entries.empty()) {
      table += head + "none recorded\n";
      continue;
    }
    const auto& entries = view.ring->entries;
    const std::size_t first = entries.size() > static_cast<std::size_t>(depth)
                                  ? entries.size() - static_cast<std::size_t>(depth)
                                  : 0;
    const std::string indent(head.size(), ' ');
    for (std::size_t i = first; i < entries.size(); ++i) {
      const CollectiveEntry& e = entries[i];
      std::string line = i == first ? head : indent;
      const std::string& group = group_name(*view.ring, e);
      if (group != "world") line += "[" + group + "] ";
      line += (contract::is_point_to_point(e.op) ? "transfer #" : "#") + std::to_string(e.seq) +
              " " + describe_call(e) + ", ";
      if (e.state == EntryState::kInFlight) {
        line += "in flight for " + describe_duration(now_ns - e.entered_ns);
      } else {
        line += std::string(contract::state_name(e.state)) + " in " +
                describe_duration(std::max<std::int64_t>(e.ended_ns - e.entered_ns, 0));
      }
      table += line + "\n";
    }
  }
  table.pop_back();  // no newline after the last line
  return table;
}

}  // namespace

std::map<std::string, std::vector<int>> recorded_groups(const std::vector<RankView>& ranks) {
  std::map<std::string, std::vector<int>> members;
  for (const RankView& view : ranks) {
    if (!view.ring) continue;
    for (const contract::RingGroup& group : view.ring->groups) {
      auto& known = members[group.name];
      if (known.empty() && !group.members.empty()) known = group.members;
    }
  }
  for (auto& [name, global] : members) {
    if (!global.empty()) continue;
    for (const RankView& view : ranks) global.push_back(view.rank);
  }
  return members;
}

std::string describe_duration(std::int64_t ns) {
  ns = std::max<std::int64_t>(ns, 0);
  char text[48];
  if (ns < 1'000'000) {
    std::snprintf(text, sizeof text, "%.0f us", static_cast<double>(ns) / 1e3);
  } else if (ns < 1'000'000'000) {
    std::snprintf(text, sizeof text, "%.1f ms", static_cast<double>(ns) / 1e6);
  } else if (ns < 120'000'000'000) {
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ns) / 1e9);
  } else {
    const std::int64_t seconds = ns / 1'000'000'000;
    std::snprintf(text, sizeof text, "%lld min %lld s", static_cast<long long>(seconds / 60),
                  static_cast<long long>(seconds % 60));
  }
  return text;
}

std::optional<InFlight> longest_in_flight(const std::vector<RankView>& ranks) {
  std::optional<InFlight> longest;
  for (const RankView& view : ranks) {
    if (!view.ring) continue;
    for (const CollectiveEntry& e : view.ring->entries) {
      if (e.state != EntryState::kInFlight) continue;
      if (!longest || e.entered_ns < longest->since_ns) longest = InFlight{view.rank, e.entered_ns};
    }
  }
  return longest;
}

std::int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool in_flight_for(const std::vector<RankView>& ranks, std::chrono::milliseconds limit,
                   std::int64_t now_ns) {
  const std::optional<InFlight> longest = longest_in_flight(ranks);
  return longest && now_ns - longest->since_ns >=
                        std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
}

Diagnosis diagnose(const std::vector<RankView>& ranks, std::int64_t now_ns, int depth) {
  const std::vector<Group> groups = groups_of(ranks);
  // The group waited on longest: the one holding the oldest entry in flight (else the
  // oldest failed one), at the lowest sequence number open in it.
  const Group* chosen = nullptr;
  std::uint64_t seq = 0;
  std::int64_t oldest = 0;
  bool chosen_in_flight = false;
  for (const Group& group : groups) {
    std::uint64_t lowest = 0;
    std::int64_t since = 0;
    bool in_flight = false;
    for (const Member& m : group.members) {
      for (const CollectiveEntry* e : m.entries) {
        if (e->state == EntryState::kCompleted) continue;
        const bool open = e->state == EntryState::kInFlight;
        if (in_flight && !open) continue;
        if (lowest == 0 || (open && !in_flight) || e->seq < lowest) {
          lowest = e->seq;
          since = e->entered_ns;
          in_flight = open;
        }
      }
    }
    if (lowest == 0) continue;
    const bool better = chosen == nullptr || (in_flight && !chosen_in_flight) ||
                        (in_flight == chosen_in_flight && since < oldest);
    if (better) {
      chosen = &group;
      seq = lowest;
      oldest = since;
      chosen_in_flight = in_flight;
    }
  }
  Diagnosis d;
  if (chosen != nullptr) {
    d = judge(*chosen, seq, now_ns);
  } else if (std::any_of(ranks.begin(), ranks.end(),
                         [](const RankView& v) { return v.end.empty(); })) {
    d.kind = Diagnosis::Kind::kOutside;
    d.verdict =
        "no rank is in a collective of sgpu's process groups: every rank still running is "
        "blocked or busy outside them (the table shows where each left off).";
  }
  d.table = table_of(ranks, now_ns, depth);
  return d;
}

}  // namespace sgpu::launcher
