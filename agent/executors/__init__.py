"""Where evaluations run: on this node (`local`) or as tasks on a Ray cluster (`ray`), behind one interface.

The runner describes an evaluation as an EvalRequest and gets an EvalResult back. A request carries the
candidate's source, not a path, so a remote node needs no shared filesystem; it names the problem by its
loader spec, which every node resolves against its own install of pkb-agent. Agent loops and model calls
stay in the driver: only the harness runs where the devices are, so no GPU is held while a model thinks.

The package, by concern:
- .request: EvalRequest (one evaluation by value) and what both executors share: the candidate as a file,
  the result under the driver's file name, an infra_error result, device seconds;
- .interface: the Executor protocol the runner and the tools program against, and adapters to it;
- .local: LocalExecutor: harness.evaluate on this node, inside a lease of the runner's DeviceScheduler;
- .ray_cluster: RayExecutor: one Ray task per evaluation, asking for W GPUs (Ray never splits one task's resources over
  nodes, so the W GPUs are on one node: one NVLink island). The task writes the source to a temporary
  file, runs the harness there and returns the EvalResult as JSON plus the rank logs; the driver writes
  the logs into the run directory. A worker or node that dies mid-evaluation makes Ray run the task
  again (max_retries; on another node when the node is gone); when the retries run out the evaluation
  comes back as verdict `infra_error`, which is never charged to the model;
- .reaper: the watcher a Ray task runs beside its evaluation (`python -m agent.executors.reaper`), so that
  no rank outlives a worker that died;
- .factory: make_executor, by name.

Both executors give the same verdict, failing rank, trial and phase, and flags for the same request (the
tests show it); timings, stage durations and the environment record say where and how fast it ran.
"""

# This package's __init__ stays free of imports: the CLI lists the executors and the reaper runs as
# `python -m agent.executors.reaper` without loading the harness.
EXECUTORS = ("local", "ray")


class ExecutorError(RuntimeError):
    """An executor that cannot be built or reached (Ray missing, cluster unreachable, nodes out of step)."""
