// NOTE [Abrupt ends]
// A rank that goes down without an error record (a crash, a simulated fault's exit or
// abort) first notes the time in rank-N/abrupt-end (RankFolder::abrupt_end()). Its exit may
// reach the launcher after a peer's: the peer's collective failed because of it and the
// peer exited, or the fork server reported the two exits in another order. The launcher
// then still counts the rank's end as its own failure, at the time it happened, so the
// root cause stays the rank that went down, not the peer, and not "terminated by sgpu".
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>

namespace sgpu::contract {

// Where note_abrupt_end() writes: called once in the rank, before anything can crash.
void arm_abrupt_end(const std::filesystem::path& file);

// Async-signal-safe, for crash handlers: writes the wall-clock time to the armed file,
// unless a note is already there (the first one wins). Does nothing when unarmed.
void note_abrupt_end() noexcept;

// The time noted in `file`; nullopt when there is none (or it cannot be read).
std::optional<std::chrono::system_clock::time_point> read_abrupt_end(
    const std::filesystem::path& file);

}  // namespace sgpu::contract
