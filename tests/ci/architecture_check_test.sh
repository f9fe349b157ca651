#!/usr/bin/env bash
# ci/check-architecture on a copy of the tree: the tree as it is passes; each include the
# module table forbids, added to the copy, fails the check with its file and line.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check=$top/ci/check-architecture
paths=('*.h' '*.cc' '*.in' docs/architecture.md)
source "$here/tree_copy.sh"
mutate() {  # mutate FILE LINE: append LINE to FILE in a fresh copy
  fresh_copy
  echo "$2" >>"$work/tree/$1"
  lines=$(wc -l <"$work/tree/$1")
}

what="the tree as it is"
fresh_copy
expect 0 'every include allowed'

# forbidden WHAT FILE LINE PATTERN: LINE appended to FILE fails the check with PATTERN,
# where @ stands for the line number it was appended at.
forbidden() {
  what=$1
  mutate "$2" "$3"
  expect 1 "${4//@/$lines}"
}
forbidden "the launcher including the simulated backend" src/launcher/process.cc \
  '#include "sim/sim_backend.h"' '^src/launcher/process.cc:@: launcher may not include sim/sim_backend.h \(sim\)'
forbidden "a public header including the launcher" src/sgpu/options.h \
  '#include "rank/program.h"' '^src/sgpu/options.h:@: public header includes src/rank/program.h'
forbidden "the backend interface including libtorch" src/backend/backend.h \
  '#include <torch/csrc/distributed/c10d/Backend.hpp>' '^src/backend/backend.h:@: backend may not include torch/.* \(libtorch\)'
forbidden "tracking including the rank's side" src/tracking/store.cc \
  '#include "rank/program.h"' '^src/tracking/store.cc:@: tracking may not include'
forbidden "the rank's side including the caller's" src/rank/rank_protocol.cc \
  '#include "launcher/process.h"' '^src/rank/rank_protocol.cc:@: rank may not include src/launcher/process.h \(launcher\)'
forbidden "several nodes including the caller's" src/nodes/nodes.cc \
  '#include "launcher/monitor.h"' '^src/nodes/nodes.cc:@: nodes may not include src/launcher/monitor.h \(launcher\)'
forbidden "an example including an internal header" examples/hello_world.cc \
  '#include "backend/backend_table.h"' '^examples/hello_world.cc:@: examples may not include'
forbidden "a benchmark including a test's helper" bench/bench_tracking.cc \
  '#include "tracking/store_support.h"' '^bench/bench_tracking.cc:@: bench may not include tests/tracking/store_support.h \(tests\)'
forbidden "an include that names no file of the tree" src/launcher/process.cc \
  '#include "launcher/no_such_header.h"' '^src/launcher/process.cc:@: "launcher/no_such_header.h" is no file of the tree'

what="a file in a folder the table does not name"
fresh_copy
mkdir -p "$work/tree/src/unlisted"
echo 'int x;' >"$work/tree/src/unlisted/x.cc"
expect 1 '^src/unlisted/x.cc:1: in no module'

if ((failures)); then
  echo "architecture_check_test: $failures failed"
  exit 1
fi
echo "architecture_check_test: all passed"
