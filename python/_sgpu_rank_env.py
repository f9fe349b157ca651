"""The variables sgpu's launcher starts a rank with, the roles SGPU_ROLE names and
the backends' names (NOTE [The rank environment] in src/contract/rank_env.h), and the
option table's variables for the settings read before the native module loads, for
Python that may not load it: `import sgpu`, the interpreter's startup hook. Made
from that contract (contract::python_rank_names()), which contract_test keeps this
file equal to. It imports nothing."""

ROLE = "SGPU_ROLE"
RANK_DIR = "SGPU_RANK_DIR"
DEVICE_INDEX = "SGPU_DEVICE_INDEX"
RANK_BACKEND = "SGPU_RANK_BACKEND"
SUPERVISOR_PID = "SGPU_SUPERVISOR_PID"
SIM_COMPUTE = "SGPU_SIM_COMPUTE"
NODE_MEMORY = "SGPU_NODE_MEMORY"

# What SGPU_ROLE says a process is.
RANK_ROLE = "rank"
PROGRAM_ROLE = "program"
WORKER_ROLE = "worker"
FORK_SERVER_ROLE = "fork-server"

# The backends' names, as SGPU_RANK_BACKEND gives them.
CUDA_BACKEND = "cuda"
SIM_BACKEND = "sim"

# The variables of the settings read before the native module loads.
BACKEND_SETTING = "SGPU_BACKEND"
SIM_NODE_SETTING = "SGPU_SIM"
SIM_CUDA_SETTING = "SGPU_SIM_CUDA"
SERVERLESS_GPU_SETTING = "SGPU_SERVERLESS_GPU"
