"""The train step's checkpoints in a remote run folder: each one published as it is written,
the newest one fetched when a step resumes.

The local `tf.train.CheckpointManager` folder is the working copy; `{step}/checkpoints/` in
the run folder is what a retry on another machine resumes from. Publishing sends only the new
checkpoint's files, then TensorFlow's index file `checkpoint` (it names the newest
checkpoint), then deletes the remote files of checkpoints the manager no longer keeps.

The index goes last so that a preemption cutting the upload short leaves the remote index
naming the previous checkpoint, whose files are all in place: the retry resumes from it and
recomputes the steps since (docs/preemption.md). Sending only the new files keeps the
preemption save to one checkpoint's bytes (about 1.3 GB at BERT-base size with the Adam
slots) instead of every kept one (benchmarks/preemption_save.py).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from tasks.io import storage
from tasks.io.uris import join_uri

INDEX = "checkpoint"  # tf.train.CheckpointManager's state file (a CheckpointState proto)
# Data files are cut at this size so that a checkpoint uploads over several connections at
# once (the storage clients send a folder's files in parallel; one resumable GCS upload is one
# stream). benchmarks/preemption_save.py measures the whole change (shards and sending only
# the new checkpoint); sharding alone was only tried in a one-off exploration, no results file.
SHARD_BYTES = 256 << 20


def save_options():
    """tf.train.CheckpointOptions for every save of the train step: data files sharded at
    SHARD_BYTES."""
    import tensorflow as tf

    return tf.train.CheckpointOptions(
        experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(SHARD_BYTES))


def checkpoint_name(file_name: str) -> str:
    """"ckpt-12" for "ckpt-12.index" or "ckpt-12.data-00000-of-00001"."""
    return file_name.split(".", 1)[0]


def checkpoint_files(local_dir: Path, name: str) -> list[str]:
    """The files of checkpoint `name` (its .index and .data-* shards) in `local_dir`."""
    return sorted(p.name for p in Path(local_dir).iterdir()
                  if p.is_file() and checkpoint_name(p.name) == name and p.name != INDEX)


def publish(manager, local_dir: Path, uri: str) -> None:
    """Send the manager's latest checkpoint from `local_dir` to `uri`, then the index, then
    drop the remote files of checkpoints the manager has let go."""
    name = Path(manager.latest_checkpoint).name
    storage.upload_dir(local_dir, uri, checkpoint_files(local_dir, name))
    storage.upload_dir(local_dir, uri, [INDEX])
    kept = {Path(p).name for p in manager.checkpoints}
    for file_uri in storage.list_uris(uri):
        file_name = file_uri.rstrip("/").rsplit("/", 1)[-1]
        if file_name != INDEX and checkpoint_name(file_name) not in kept:
            storage.delete_prefix(file_uri)


def latest_name(uri: str) -> str | None:
    """The checkpoint the remote index at `uri` names, or None if there is no index."""
    import tensorflow as tf

    index = join_uri(uri, INDEX)
    if not storage.exists(index):
        return None
    with tempfile.TemporaryDirectory(prefix="bertflow-ckpt-index-") as tmp:
        (Path(tmp) / INDEX).write_bytes(storage.read_bytes(index))
        state = tf.train.get_checkpoint_state(tmp)
    return Path(state.model_checkpoint_path).name if state else None


def fetch_latest(uri: str, local_dir: Path) -> str | None:
    """Download the index at `uri` and the files of the checkpoint it names into `local_dir`
    (older kept checkpoints stay remote: a resume reads only the newest). Returns that
    checkpoint's name, or None when `uri` holds no checkpoint."""
    name = latest_name(uri)
    if name is None:
        return None
    files = [u.rstrip("/").rsplit("/", 1)[-1] for u in storage.list_uris(uri)]
    wanted = [f for f in files if checkpoint_name(f) == name and f != INDEX]
    storage.download_dir(uri, local_dir, wanted + [INDEX])
    return name
