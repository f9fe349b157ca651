// sgpu: run one C++ function on every GPU of a node (real or simulated) and get back
// every rank's return value. Start main() with sgpu::init(argc, argv).
//
// The public headers: this one (distributed, options, errors, rank helpers, inventory,
// tracking), <sgpu/process_group.h> (the rank's c10d group), <sgpu/parallel.h> (DDP, FSDP,
// ZeRO), <sgpu/checkpoint.h> and <sgpu/data.h>. Nothing under sgpu/internal/ is for users.
#pragma once

#include "sgpu/comm.h"
#include "sgpu/compute.h"
#include "sgpu/distributed.h"
#include "sgpu/errors.h"
#include "sgpu/inventory.h"
#include "sgpu/memory.h"
#include "sgpu/options.h"
#include "sgpu/runtime.h"
#include "sgpu/tracking.h"
