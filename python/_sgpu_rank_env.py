"""The variables sgpu's launcher starts a rank with, and the roles SGPU_ROLE names
(NOTE [The rank environment] in src/contract/rank_env.h), for Python that may not load
the native module: `import sgpu`, the interpreter's startup hook. Made from that
contract (contract::python_rank_names()), which contract_test keeps this file equal
to. It imports nothing."""

ROLE = "SGPU_ROLE"
RANK_DIR = "SGPU_RANK_DIR"
DEVICE_INDEX = "SGPU_DEVICE_INDEX"
RANK_BACKEND = "SGPU_RANK_BACKEND"
SUPERVISOR_PID = "SGPU_SUPERVISOR_PID"
SIM_COMPUTE = "SGPU_SIM_COMPUTE"

# What SGPU_ROLE says a process is.
RANK_ROLE = "rank"
PROGRAM_ROLE = "program"
WORKER_ROLE = "worker"
FORK_SERVER_ROLE = "fork-server"
