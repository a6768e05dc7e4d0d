"""Names vulture (the dead-code check in .ci/run) reports as unused that are used where it cannot see.

Each group says who uses them. Everything else vulture reports is dead code: remove it, do not list it here.
"""

from vulture.whitelist_utils import Whitelist

# torch.distributed calls a ProcessGroup's methods from C++ (harness.emulation.collectives.group: the
# host collectives of emulated ranks), and a Work's (work.py) when a caller waits on it.
process_group = Whitelist()
process_group.getBackendName
process_group.getGroupName
process_group.setGroupName
process_group.getGroupDesc
process_group.setGroupDesc
process_group.abort
process_group.allreduce_coalesced
process_group.reduce_scatter_tensor_coalesced
process_group.allgather_coalesced
process_group.allgather_into_tensor_coalesced
process_group.alltoall
process_group.alltoall_base
process_group.recv_anysource
process_group.get_future
process_group.is_completed
process_group.is_success

# The emulated symmetric-memory handle's API, called by candidates (torch's _SymmetricMemory has it), and the
# package's lazy attributes (module __getattr__, PEP 562).
emulation = Whitelist()
emulation.boxed
emulation.__getattr__
emulation.GroupName  # named in a string annotation: cast("GroupName", ...)

# Read by the library they are handed to: functools.wraps' __wrapped__ (inspect.unwrap), sqlite3's
# row_factory, rich's show_edge, socketserver's daemon_threads, http.server's do_POST and log_message,
# LangChain's BaseChatModel._generate (and its run_manager argument), signal handlers' signum, pytest's
# exitstatus and pytestmark, tempfile.tempdir.
library = Whitelist()
library.__wrapped__
library.row_factory
library.show_edge
library.daemon_threads
library.do_POST
library.log_message
library._generate
library.run_manager
library.signum
library.exitstatus
library.pytestmark
library.tempdir

# Fields of records that are written whole (pydantic models dumped to JSON, dataclasses through asdict): the
# reader is the record's file, a report or a person, not a line of Python.
record = Whitelist()
record.table_name  # agent.scripted's answer table: the table's kind in its JSON
record.schema_version
record.discovered_at
record.protocol
record.memory_pct
record.looked_in
record.stderr_tail
record.ours_phase
record.infra_cause
record.mean_ms
record.host_span_median_ms
record.judged_outputs
record.refill_median_ms
record.min_input_sets  # TimingConfig: read from its model_dump() by harness.rank.timed.input_sets_needed
record.input_memory_fraction

# The infra_error causes, listed once as data (docs/harness.md and every infra_error record name them).
record.INFRA_CAUSES

# The reply types of harness.common.messages: TypedDicts whose fields the reply check reads from their
# annotations, and the judge reads by string key.
messages = Whitelist()
messages.tripwire
messages.died
messages.probe_note
messages.previous_changed
messages.changed_after_return
messages.input_fingerprint
messages.kept_bytes
messages.kept_intact
messages.refill_ms
messages.refill_host_ms
messages.barrier_enqueue_us

# pytest fixtures taken for their effect (autouse-like, named in the test's parameters).
fixtures = Whitelist()
fixtures.fresh_cancel
fixtures.no_bubblewrap
fixtures.one_rank_group
