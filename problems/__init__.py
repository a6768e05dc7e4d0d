"""The suite: one module per problem (metadata, inputs, the reference, the oracle); torch only.

May import: nothing of ours.
"""
