#!/usr/bin/env bash
# ci/check-test-names on a copy of the tree: the tree as it is passes; a source with no test,
# a test in another module's folder, an allowance that is stale or names a test that is gone
# each fail the check, naming the file.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
check=$top/ci/check-test-names
paths=(src sim python/native tests)
source "$here/tree_copy.sh"

what="the tree as it is"
fresh_copy
expect 0 'sources have a test by name'

what="a new source with no test"
fresh_copy
echo 'int x;' >"$work/tree/src/launcher/new_part.cc"
expect 1 '^src/launcher/new_part.cc: no test tests/launcher/new_part_test.cc'

what="a test in another module's folder"
fresh_copy
mv "$work/tree/tests/collectives/recorder_test.cc" "$work/tree/tests/parallel/"
expect 1 '^tests/parallel/recorder_test.cc: named after a source whose tests live in tests/collectives/'

what="an allowed source that now has its test"
fresh_copy
echo 'int x;' >"$work/tree/tests/tracking/store_test.cc"
expect 1 '^src/tracking/store.cc: has its test tests/tracking/store_test.cc; drop it from ALLOWED'

what="an allowed source that is gone"
fresh_copy
rm "$work/tree/src/sgpu/errors.cc"
expect 1 '^src/sgpu/errors.cc: in ALLOWED but not a source'

what="an allowance naming a test that is gone"
fresh_copy
rm "$work/tree/tests/sim/shm_transport_test.cc"
expect 1 '^sim/shm/segment.cc: ALLOWED names tests/sim/shm_transport_test.cc, which does not exist'

if ((failures)); then
  echo "test_names_check_test: $failures failed"
  exit 1
fi
echo "test_names_check_test: all passed"
