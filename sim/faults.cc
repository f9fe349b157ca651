#include "sim/faults.h"

#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "contract/abrupt_end.h"
#include "sgpu/errors.h"

namespace sgpu::sim {
namespace {

[[noreturn]] void bad_plan(std::string_view part, const std::string& why) {
  throw ConfigError("bad fault plan entry \"" + std::string(part) + "\": " + why +
                    ". Write rank=R:ACTION[@POINT] joined by ';', with ACTION one of abort, "
                    "segv, exit=CODE, throw, hang, slow=DURATION and POINT one of start, "
                    "collective=K, after=DURATION (DURATION like 250ms or 2s)");
}

int parse_int(std::string_view part, std::string_view text, const char* what) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    bad_plan(part, std::string(what) + " \"" + std::string(text) + "\" is not a number");
  }
  return value;
}

std::chrono::milliseconds parse_duration(std::string_view part, std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string_view unit = text.substr(digits);
  if (digits == 0 || (unit != "ms" && unit != "s")) {
    bad_plan(part, "duration \"" + std::string(text) + "\" is not like 250ms or 2s");
  }
  const int n = parse_int(part, text.substr(0, digits), "duration");
  return unit == "s" ? std::chrono::milliseconds(n * 1000) : std::chrono::milliseconds(n);
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

}  // namespace

std::vector<Fault> parse_faults(std::string_view plan, int world_size) {
  std::vector<Fault> faults;
  while (!plan.empty()) {
    const std::size_t semi = plan.find(';');
    const std::string_view part = trim(plan.substr(0, semi));
    plan = semi == std::string_view::npos ? std::string_view() : plan.substr(semi + 1);
    if (part.empty()) continue;
    Fault fault;
    if (part.rfind("rank=", 0) != 0) bad_plan(part, "it does not start with rank=");
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos) bad_plan(part, "no ':' before the action");
    fault.rank = parse_int(part, part.substr(5, colon - 5), "rank");
    if (fault.rank < 0 || fault.rank >= world_size) {
      bad_plan(part, "rank " + std::to_string(fault.rank) + " is outside the call's ranks 0 to " +
                         std::to_string(world_size - 1));
    }
    std::string_view action = part.substr(colon + 1);
    std::string_view point = "start";
    if (const std::size_t at = action.find('@'); at != std::string_view::npos) {
      point = action.substr(at + 1);
      action = action.substr(0, at);
    }
    if (action == "abort") {
      fault.action = Fault::Action::kAbort;
    } else if (action == "segv") {
      fault.action = Fault::Action::kSegv;
    } else if (action.rfind("exit=", 0) == 0) {
      fault.action = Fault::Action::kExit;
      fault.exit_code = parse_int(part, action.substr(5), "exit code");
    } else if (action == "throw") {
      fault.action = Fault::Action::kThrow;
    } else if (action == "hang") {
      fault.action = Fault::Action::kHang;
    } else if (action.rfind("slow=", 0) == 0) {
      fault.action = Fault::Action::kSlow;
      fault.slow = parse_duration(part, action.substr(5));
    } else {
      bad_plan(part, "unknown action \"" + std::string(action) + "\"");
    }
    if (point == "start") {
      fault.point = Fault::Point::kStart;
    } else if (point.rfind("collective=", 0) == 0) {
      fault.point = Fault::Point::kCollective;
      fault.collective = parse_int(part, point.substr(11), "collective");
      if (fault.collective < 1) bad_plan(part, "collectives count from 1");
    } else if (point.rfind("after=", 0) == 0) {
      fault.point = Fault::Point::kAfter;
      fault.after = parse_duration(part, point.substr(6));
      if (fault.action == Fault::Action::kThrow || fault.action == Fault::Action::kHang) {
        bad_plan(part, std::string(action) +
                           " happens in the rank's own thread: use start or collective=K");
      }
    } else {
      bad_plan(part, "unknown point \"" + std::string(point) + "\"");
    }
    faults.push_back(fault);
  }
  return faults;
}

void act(const Fault& fault) {
  switch (fault.action) {
    case Fault::Action::kAbort:
      contract::note_abrupt_end();  // NOTE [Abrupt ends]
      std::abort();
    case Fault::Action::kSegv:
      contract::note_abrupt_end();
      ::raise(SIGSEGV);
      std::abort();
    case Fault::Action::kExit:
      contract::note_abrupt_end();
      ::_exit(fault.exit_code);
    case Fault::Action::kThrow:
      throw std::runtime_error("sgpu sim fault: rank " + std::to_string(fault.rank) + " throws");
    case Fault::Action::kHang:
      while (true) std::this_thread::sleep_for(std::chrono::hours(1));
    case Fault::Action::kSlow:
      std::this_thread::sleep_for(fault.slow);
      return;
  }
}

std::string describe(const Fault& fault) {
  std::string text = "rank=" + std::to_string(fault.rank) + ":";
  switch (fault.action) {
    case Fault::Action::kAbort:
      text += "abort";
      break;
    case Fault::Action::kSegv:
      text += "segv";
      break;
    case Fault::Action::kExit:
      text += "exit=" + std::to_string(fault.exit_code);
      break;
    case Fault::Action::kThrow:
      text += "throw";
      break;
    case Fault::Action::kHang:
      text += "hang";
      break;
    case Fault::Action::kSlow:
      text += "slow=" + std::to_string(fault.slow.count()) + "ms";
      break;
  }
  switch (fault.point) {
    case Fault::Point::kStart:
      return text + "@start";
    case Fault::Point::kCollective:
      return text + "@collective=" + std::to_string(fault.collective);
    case Fault::Point::kAfter:
      return text + "@after=" + std::to_string(fault.after.count()) + "ms";
  }
  return text;
}

}  // namespace sgpu::sim
