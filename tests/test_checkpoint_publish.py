"""Checkpoints published to a run folder on local disk, the GCS emulator and moto's S3 server:
only the new checkpoint is sent, the index last, dropped ones are deleted, and a publish cut
short leaves the previous checkpoint to resume from."""
from __future__ import annotations

import pytest
import tensorflow as tf

from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.io import storage
from tasks.training import checkpoint_publish
from tasks.training.checkpoint_publish import INDEX


class Interrupted(Exception):
    pass


def manager_at(directory, max_to_keep=2):
    value = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(value=value), str(directory),
                                         max_to_keep=max_to_keep)
    return value, manager


def remote_names(uri):
    return sorted(u.rsplit("/", 1)[-1] for u in storage.list_uris(uri))


def resume(uri, local):
    """What a retry on a fresh machine does: fetch the newest checkpoint and restore it."""
    name = checkpoint_publish.fetch_latest(uri, local)
    value, manager = manager_at(local)
    manager.checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    return name, value, manager


def restored_value(uri, tmp_path):
    name, value, _ = resume(uri, tmp_path / "resumed")
    return name, float(value.numpy())


def test_each_publish_sends_the_new_checkpoint_and_drops_the_ones_let_go(root, tmp_path):
    uri = f"{root}/train/checkpoints"
    value, manager = manager_at(tmp_path / "local")
    sent = []
    real_upload = storage.upload_dir

    def upload(local_dir, target, names=None):
        sent.append(list(names))
        real_upload(local_dir, target, names)

    for step in (10, 20, 30):
        value.assign(float(step))
        manager.save(checkpoint_number=step)
        storage.upload_dir, saved = upload, storage.upload_dir
        try:
            checkpoint_publish.publish(manager, tmp_path / "local", uri)
        finally:
            storage.upload_dir = saved
    # Each publish: that checkpoint's own files, then the index alone (never older ones).
    assert sent[-2:] == [["ckpt-30.data-00000-of-00001", "ckpt-30.index"], [INDEX]]
    assert remote_names(uri) == [INDEX, "ckpt-20.data-00000-of-00001", "ckpt-20.index",
                                 "ckpt-30.data-00000-of-00001", "ckpt-30.index"]
    assert restored_value(uri, tmp_path) == ("ckpt-30", 30.0)
    # Only the newest is fetched; the older kept one stays remote.
    assert sorted(p.name for p in (tmp_path / "resumed").iterdir()) == [
        INDEX, "ckpt-30.data-00000-of-00001", "ckpt-30.index"]


@pytest.mark.parametrize("cut_after", ["ckpt-20.data-00000-of-00001", "ckpt-20.index"])
def test_a_publish_cut_short_leaves_the_previous_checkpoint_to_resume_from(
        root, tmp_path, monkeypatch, cut_after):
    uri = f"{root}/train/checkpoints"
    value, manager = manager_at(tmp_path / "local")
    value.assign(10.0)
    manager.save(checkpoint_number=10)
    checkpoint_publish.publish(manager, tmp_path / "local", uri)

    real_upload = storage.upload_dir

    def preempted(local_dir, target, names=None):  # the machine goes mid-upload
        sent_first = [n for n in names if n <= cut_after]
        real_upload(local_dir, target, sent_first)
        raise Interrupted

    value.assign(20.0)
    manager.save(checkpoint_number=20)
    monkeypatch.setattr(storage, "upload_dir", preempted)
    with pytest.raises(Interrupted):
        checkpoint_publish.publish(manager, tmp_path / "local", uri)
    monkeypatch.setattr(storage, "upload_dir", real_upload)

    assert cut_after in remote_names(uri)  # part of step 20 is there, but not its index
    assert restored_value(uri, tmp_path) == ("ckpt-10", 10.0)

    # The retry resumes at 10 and publishes steps 20 and 30 again: the half-sent files are
    # replaced, and what is left is exactly the two kept checkpoints and the index.
    _, value, manager = resume(uri, tmp_path / "retry")
    for step in (20, 30):
        value.assign(float(step))
        manager.save(checkpoint_number=step)
        checkpoint_publish.publish(manager, tmp_path / "retry", uri)
    assert remote_names(uri) == [INDEX, "ckpt-20.data-00000-of-00001", "ckpt-20.index",
                                 "ckpt-30.data-00000-of-00001", "ckpt-30.index"]
    assert restored_value(uri, tmp_path) == ("ckpt-30", 30.0)


def test_no_index_means_nothing_to_resume(root, tmp_path):
    assert checkpoint_publish.fetch_latest(f"{root}/train/checkpoints", tmp_path) is None
    assert not any(tmp_path.iterdir())


def test_a_sharded_checkpoint_is_published_and_restored_whole(root, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_publish, "SHARD_BYTES", 4096)
    uri = f"{root}/train/checkpoints"
    values = [tf.Variable(tf.random.stateless_normal([1024], seed=[i, 0])) for i in range(4)]
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=values), str(tmp_path / "local"),
                                         max_to_keep=2)
    manager.save(checkpoint_number=1, options=checkpoint_publish.save_options())
    checkpoint_publish.publish(manager, tmp_path / "local", uri)
    data_files = [n for n in remote_names(uri) if ".data-" in n]
    assert len(data_files) >= 4, data_files  # 4 KiB variables, 4 KiB shards

    copies = [tf.Variable(tf.zeros([1024])) for _ in range(4)]
    checkpoint_publish.fetch_latest(uri, tmp_path / "resumed")
    tf.train.Checkpoint(v=copies).restore(
        tf.train.latest_checkpoint(str(tmp_path / "resumed"))).assert_consumed()
    assert all((a.numpy() == b.numpy()).all() for a, b in zip(values, copies))
