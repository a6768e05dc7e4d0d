"""What an evaluation leaves: the result schema, the environment fingerprint, the reference cache and
where caches live, and redaction of secrets from everything written.

May import: common.
"""
