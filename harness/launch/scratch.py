"""What a pool lends its ranks on disk: its private folder (owner file, sandbox log, under the harness's private
root) and in it the one writable scratch folder, held open from before any rank started, so the harness
touches what the ranks wrote there only through that held folder (harness.common.hostile_files).
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.common import hostile_files
from harness.launch import leftovers
from harness.launch.sandbox.policy import SANDBOX_UID
from harness.launch.sandbox.private import OWNER_FILE, hand_over, private_folder, remove_private

# The candidate's own folders in its scratch (TMPDIR, caches, HOME), made when the pool starts.
SCRATCH_DIRS = ("tmp", "cache", "home")


class Lease:
    """The pool's folder and scratch. `host_uid_switch`: ranks run as their own uid on the host, so what they
    write into is handed to that uid (and the extensions folder with it)."""

    def __init__(self, host_uid_switch: bool, extensions: Path | None) -> None:
        self.host_uid_switch = host_uid_switch
        self.extensions = extensions
        self.folder: Path | None = None
        self.scratch: Path | None = None
        self.files: hostile_files.Folder | None = None

    def take(self, marker: str) -> tuple[Path, Path]:
        """Make the pool's folder (its owner file names this process and the pool's marker) and its scratch."""
        leftovers.reap_stale_folders()
        self.folder = folder = private_folder(leftovers.FOLDER_PREFIX)
        (folder / OWNER_FILE).write_text(f"{leftovers.process_identity(os.getpid()) or ''}\n{marker}\n")
        self.scratch = self._make_scratch(folder / "scratch")
        return folder, self.scratch

    def give_to_sandbox(self, path: Path) -> None:
        """Make `path` (and what is in it) the sandbox's uid's, where ranks run as their own uid on the host."""
        if self.host_uid_switch:
            hand_over(path, SANDBOX_UID)

    def _make_scratch(self, scratch: Path) -> Path:
        """The scratch folder and the candidate's own folders in it (TMPDIR, caches, HOME). Where ranks run as
        another uid, the scratch stays the harness's (sticky, writable by all: ranks create files in it but
        cannot remove or replace what the harness made) and those folders are the ranks'. Everything inside
        the scratch is made through its held folder (harness.common.hostile_files), as every later access is."""
        scratch.mkdir(mode=0o700)
        if self.host_uid_switch:
            os.chmod(scratch, 0o1777)
        self.files = files = hostile_files.Folder.open(scratch)
        for sub in SCRATCH_DIRS:
            files.make_dir(sub, 0o700)
            self.give_to_sandbox(scratch / sub)
        if self.extensions is not None:
            self.give_to_sandbox(self.extensions)
        return scratch

    def exchange_dir(self, name: str, writable: bool) -> Path:
        """A folder of the scratch for files the harness and the ranks exchange, made before any candidate code
        runs (so none can have put a link in its place). `writable`: the ranks write into it (outputs); else
        only the harness does (inputs), and where ranks run as another uid they cannot."""
        assert self.scratch is not None and self.files is not None
        path = self.scratch / name
        self.files.make_dir(name, 0o755 if not writable else 0o700)
        if writable:
            self.give_to_sandbox(path)
        return path

    def give_back(self) -> None:
        """Close the held scratch and remove the pool's folder (nothing when given back already)."""
        if self.files is not None:
            self.files.close()
            self.files = None
        if self.folder is not None:
            remove_private(self.folder)
            self.folder = None
