"""tf.data service on an ImageNet-shaped folder, with TensorFlow's own fast
path for random-resized crops (the one its ImageNet preprocessing uses):
sample_distorted_bounding_box on the JPEG header's shape, then
decode_and_crop_jpeg, which decodes only the crop. Then an antialiased
bilinear resize to 224x224 (as Pillow's), a random left-right flip, uint8,
int64 labels, batch 64. Images stay HWC (224x224x3), TensorFlow's layout:
the same bytes per sample as the 3x224x224 of the other systems.

Dispatcher and workers as in tfdata_synthetic.py: --mode inprocess or
processes, processing_mode="distributed_epoch" (each sample once)."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from common import Timer, report  # noqa: E402
from tfdata_synthetic import wait_for_workers, worker_main  # noqa: E402


def listing(root):
    """ImageFolder's order: sorted class folders, sorted files; label = class index."""
    classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir())
    files, labels = [], []
    for i, c in enumerate(classes):
        for f in sorted((Path(root) / c).iterdir()):
            if f.suffix.lower() in (".jpg", ".jpeg"):
                files.append(str(f))
                labels.append(i)
    return files, labels


def dataset(root, epochs, batch):
    files, labels = listing(root)
    ds = tf.data.Dataset.from_tensor_slices((files, tf.constant(labels, tf.int64)))
    ds = ds.shuffle(len(files), seed=0, reshuffle_each_iteration=True).repeat(epochs)

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        img = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
        img = tf.image.resize(img, [224, 224], method="bilinear", antialias=True)
        img = tf.image.random_flip_left_right(img)
        img = tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)
        return img, label

    return ds.map(load).batch(batch)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", choices=["inprocess", "processes"], default="inprocess")
    p.add_argument("--worker-of", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker_of:
        worker_main(a.worker_of, 0)
        return
    if not a.path:
        p.error("--path is required")
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    children = []
    workers = []
    try:
        if a.mode == "inprocess":
            for _ in range(a.workers):
                workers.append(tf.data.experimental.service.WorkerServer(
                    tf.data.experimental.service.WorkerConfig(dispatcher_address=address)))
        else:
            for _ in range(a.workers):
                children.append(subprocess.Popen(
                    [sys.executable, __file__, "--worker-of", address],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for_workers(dispatcher, a.workers)
        ds = dataset(a.path, a.epochs, a.batch_size).apply(
            tf.data.experimental.service.distribute(
                processing_mode="distributed_epoch", service=dispatcher.target))
        t = Timer()
        samples = nbytes = 0
        for data, label in ds:
            t.batch()
            samples += int(data.shape[0])
            nbytes += int(tf.size(data)) + int(tf.size(label)) * 8
        report(f"tf.data service ({a.mode})", samples, nbytes, t.elapsed(), t.first,
               workers=a.workers)
    finally:
        for c in children:
            c.kill()
            c.wait()


if __name__ == "__main__":
    main()
