// sgpu: run one C++ function on every GPU of a node (real or simulated) and get back
// every rank's return value. Start main() with sgpu::init(argc, argv).
#pragma once

#include "sgpu/distributed.h"
#include "sgpu/errors.h"
#include "sgpu/options.h"
#include "sgpu/runtime.h"
#include "sgpu/tracking.h"
