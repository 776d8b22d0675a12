"""Commits on disk: one file per rank and commit, written atomically, the newest `keep` commits kept.

Layout: ``<directory>/commit-<seq:09d>/rank-<rank>.gcstate``. A file is the pickled envelope of gradcomp._state
(kind "elastic_commit", the rank, world size and commit sequence number sealed with the checksum) around the
torch.save bytes of the rank's commit. A file appears under its final name only once it is complete and on disk
(written to a temporary name, fsync, rename, fsync of the folder), so a rank killed while committing leaves at most a
temporary file, which readers ignore. Reading a damaged file raises gradcomp.CorruptPayload.
"""
import io
import os
import pickle
import re
import shutil

import torch

from ... import _state
from ..._gradcomp import CorruptPayload

KIND = "elastic_commit"
SPEC = "gradcomp.elastic"
_COMMIT = re.compile(r"^commit-(\d{9})$")
_RANK = re.compile(r"^rank-(\d+)\.gcstate$")


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CommitStore:
    """The commits of one job under `directory` (created if missing; shared by every rank: one host, or a shared
    file system across hosts). `keep`: how many of the newest commits stay on disk (>= 1)."""

    def __init__(self, directory, keep=2):
        if int(keep) < 1:
            raise ValueError(f"elastic commit store: keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(directory)
        self.keep = int(keep)
        os.makedirs(self.directory, exist_ok=True)

    def commit_dir(self, seq):
        return os.path.join(self.directory, f"commit-{int(seq):09d}")

    def path(self, seq, rank):
        return os.path.join(self.commit_dir(seq), f"rank-{int(rank)}.gcstate")

    def write(self, seq, rank, world_size, payload):
        """Writes `payload` (a dict torch.save can write) as this rank's file of commit `seq`, atomically; then
        prunes commits older than the newest `keep`. Returns the file's path."""
        buf = io.BytesIO()
        torch.save(payload, buf)
        envelope = _state.seal(KIND, SPEC, buf.getvalue(), rank=int(rank), world_size=int(world_size), step=int(seq))
        folder = self.commit_dir(seq)
        os.makedirs(folder, exist_ok=True)
        final = self.path(seq, rank)
        tmp = f"{final}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(envelope, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(folder)
        self.prune(seq)
        return final

    def seqs(self):
        """Commit sequence numbers on disk, newest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted((int(m.group(1)) for m in map(_COMMIT.match, names) if m), reverse=True)

    def files(self, seq):
        """{rank: path} of the complete files of commit `seq` (temporary files left by a killed writer excluded)."""
        try:
            names = os.listdir(self.commit_dir(seq))
        except FileNotFoundError:
            return {}
        return {int(m.group(1)): os.path.join(self.commit_dir(seq), m.group(0)) for m in map(_RANK.match, names) if m}

    @staticmethod
    def read(path):
        """(rank, world_size, seq, payload) of one commit file. A damaged file (flipped or truncated bytes, not a
        commit file) raises CorruptPayload naming the path."""
        try:
            with open(path, "rb") as f:
                envelope = pickle.load(f)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
                MemoryError) as e:
            raise CorruptPayload(f"elastic commit file {path}: unreadable ({type(e).__name__}: {e})") from None
        try:
            data, seq = _state.open_state(envelope, KIND, SPEC, where=f"elastic commit file {path}")
            saved = _state.fields(envelope)
        except CorruptPayload as e:
            raise CorruptPayload(str(e)) from None
        # Our own file, its digest checked above: its objects (a sampler's, the user's extra state) are loaded as
        # written, not only tensors (torch 2.6 made weights_only=True the default; 1.13 has the flag, default False).
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        return saved["rank"], saved["world_size"], seq, payload

    def prune(self, newest):
        """Removes the commits older than the `keep` newest up to `newest` (other ranks' files too: a rank that left
        leaves its files behind), and temporary files of killed writers in them."""
        for seq in self.seqs():
            if seq <= int(newest) - self.keep:
                shutil.rmtree(self.commit_dir(seq), ignore_errors=True)
