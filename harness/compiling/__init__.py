"""Before any rank starts: a candidate's native code built in a sandboxed process with a time limit
(compile, precompile, builds), what it imports (requirements), names read from source.

May import: cancel, common, emulation, launch, problems, rank, records.
"""
