"""Files that readers in other processes may open at any moment: never half-written.

A predictor replica pulls the installed head while the learner may be writing the next one, and
either side can crash midway. So every file is written under a temporary name, flushed to disk,
and moved into place with os.replace (atomic on POSIX: a reader sees the old file or the new one).
A head is two files (weights and sidecar), so it is published as a whole directory,
`heads/v<version>/`, renamed into place when complete and never modified afterwards; then the
one-line pointer `CURRENT` is replaced to name it. A reader follows the pointer to an immutable
directory, so it gets one version's weights with that version's settings, or an older version
entire. The last few versions stay on disk for readers that read the pointer just before a swap.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from predictor.checkpoint import CheckpointMeta, load_checkpoint, save_checkpoint
from predictor.head import LengthHead

POINTER = "CURRENT"
HEADS = "heads"
KEEP_VERSIONS = 3


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / HEADS / f"v{version:06d}"


def publish_head(root: Path, version: int, head: LengthHead, meta: CheckpointMeta) -> Path:
    """Write version `version` of the head and point CURRENT at it; returns its directory."""
    final = version_dir(root, version)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        weights = save_checkpoint(staging / "head", head, meta)
        for f in (weights, weights.with_suffix(".json")):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # left by a crash between the rename and the pointer: same version number
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(final.parent)
    atomic_write(Path(root) / POINTER, json.dumps({"version": version, "dir": f"{HEADS}/{final.name}"}).encode())
    _prune(root, version)
    return final


def _prune(root: Path, current: int) -> None:
    for d in sorted((Path(root) / HEADS).glob("v*")):
        if int(d.name[1:]) <= current - KEEP_VERSIONS:
            shutil.rmtree(d, ignore_errors=True)


def published_version(root: Path) -> int | None:
    """The installed version alone: what a replica polls, loading the head only when it changed."""
    pointer = Path(root) / POINTER
    return json.loads(pointer.read_text())["version"] if pointer.exists() else None


def read_published(root: Path, expected_base_model_hash: str | None = None,
                   attempts: int = 3) -> tuple[int, LengthHead, CheckpointMeta] | None:
    """(version, head, meta) of the installed head, or None before the first install. Retries when
    the version it was pointed at was pruned before it could be read (a reader slower than
    KEEP_VERSIONS installs)."""
    for _ in range(attempts - 1):
        try:
            return _read(Path(root), expected_base_model_hash)
        except FileNotFoundError:
            continue
    return _read(Path(root), expected_base_model_hash)


def _read(root: Path, expected_base_model_hash: str | None) -> tuple[int, LengthHead, CheckpointMeta] | None:
    pointer = root / POINTER
    if not pointer.exists():
        return None
    target = json.loads(pointer.read_text())
    head, meta = load_checkpoint(root / target["dir"] / "head", expected_base_model_hash)
    return target["version"], head, meta
