"""The rank side: what runs in rank processes (trusted pools and sandboxed candidate pools alike). It
produces data (outputs, times, fingerprints) and decides nothing; see harness/judge for what does.

May import: common, emulation, problems.
"""
