// A process's tree, from /proc: what a rank (a child subreaper), the caller's starters and
// `sgpu sim` end when they go, so that nothing a program started is left running.
#pragma once

#include <sys/types.h>

#include <vector>

namespace sgpu::contract {

// SIGKILLs every live descendant of `pid` (not `pid` itself), wherever they are: in a
// session of their own too. A rank is a child subreaper, so what its children leave behind
// is its child until it dies: this reaches everything it started, while it lives.
void kill_descendants(pid_t pid);

// Every child of this process, from /proc (their parent is this process: a subreaper's
// adopted orphans among them).
std::vector<pid_t> children_of_this_process();

}  // namespace sgpu::contract
