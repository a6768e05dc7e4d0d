"""What both sides of the trust boundary use: verdict and flag names, the integrity knobs, seeds, the
reply channel's signing, the typed messages between judge and ranks, and the one way to touch files a
candidate could have written. Rank processes import this folder (and harness.rank, harness.emulation, the
problem loaders) only.

May import: nothing of ours (every other folder imports it).
"""
