"""Parquet datasets as users have them: files written by pyarrow (its
default snappy compression, several row groups, a fixed-size list column,
a text column not read, a binary column of PNG images), named by a glob,
read through `Loader.local` with and without the sampler's block shuffle."""

import numpy as np
import pytest

import loader

pa = pytest.importorskip("pyarrow", reason="pyarrow writes the test's Parquet files")
pq = pytest.importorskip("pyarrow.parquet")


def write_files(tmp_path, sizes=((10, 4), (7, 7), (10, 3))):
    """Files of `rows` rows in row groups of `group` rows; dataset row i
    has x = [10i, 10i+1, 10i+2] (float32), y = -i (int64), flag = i % 3 == 0,
    name = text. Returns the row groups as (first, end) ranges."""
    groups = []
    first = 0
    for n, (rows, group) in enumerate(sizes):
        i = np.arange(first, first + rows)
        x = (10 * i[:, None] + np.arange(3)).astype(np.float32)
        table = pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 3),
                "y": pa.array(-i, pa.int64()),
                "flag": pa.array(i % 3 == 0),
                "name": pa.array([f"row {k}" for k in i]),
            }
        )
        pq.write_table(table, tmp_path / f"part-{n}.parquet", row_group_size=group)
        groups += [(first + s, first + min(s + group, rows)) for s in range(0, rows, group)]
        first += rows
    return groups


def spec(tmp_path, **sampler):
    return {
        "dataset": {"parquet": {"files": str(tmp_path / "*.parquet"), "columns": ["x", "y", "flag"]}},
        "batch_size": 4,
        "epochs": 2,
        "sampler": {"shuffle": True, "seed": 3, **sampler},
    }


def check_rows(batch):
    x, y, flag = (np.asarray(batch[k]) for k in ("x", "y", "flag"))
    i = np.asarray(batch.indices)
    assert x.dtype == np.float32 and x.shape == (len(i), 3)
    np.testing.assert_array_equal(x, 10 * i[:, None] + np.arange(3))
    np.testing.assert_array_equal(y, -i)
    np.testing.assert_array_equal(flag, i % 3 == 0)
    assert "name" not in batch.keys()


@pytest.mark.parametrize("block_shuffle", [False, True], ids=["shuffle", "block-shuffle"])
def test_rows_of_pyarrow_files_arrive_once_per_epoch(tmp_path, block_shuffle):
    groups = write_files(tmp_path)
    group_of = {i: g for g, (a, b) in enumerate(groups) for i in range(a, b)}
    with loader.Loader.local(spec(tmp_path, block_shuffle=block_shuffle), workers=2) as dl:
        # One epoch per pass, as with DataLoader.
        batches = list(dl) + list(dl)
    assert len(batches) == 2 * 7
    orders = []
    for epoch in range(2):
        order = [i for b in batches[epoch * 7 : (epoch + 1) * 7] for i in b.indices]
        assert sorted(order) == list(range(27)), f"epoch {epoch}: {order}"
        runs = [group_of[i] for i in order]
        runs = [g for k, g in enumerate(runs) if k == 0 or runs[k - 1] != g]
        if block_shuffle:
            assert len(runs) == len(groups), f"each row group in one run: {order}"
        else:
            assert len(runs) > len(groups), f"a plain shuffle mixes row groups: {order}"
        orders.append(order)
    assert orders[0] != orders[1]
    for b in batches:
        check_rows(b)


def test_an_image_column_of_pngs_goes_through_the_jobs_transforms(tmp_path):
    PIL = pytest.importorskip("PIL.Image")
    import io

    def png(i):
        buf = io.BytesIO()
        PIL.new("RGB", (8, 6), ((i * 9) % 256, 100, 200)).save(buf, format="PNG")
        return buf.getvalue()

    for n, (first, rows) in enumerate([(0, 10), (10, 7)]):
        i = np.arange(first, first + rows)
        table = pa.table({"label": pa.array(i, pa.int64()), "png": pa.array([png(k) for k in i], pa.binary()), "name": pa.array([str(k) for k in i])})
        pq.write_table(table, tmp_path / f"part-{n}.parquet", row_group_size=4)
    job = {
        "dataset": {"parquet": {"files": str(tmp_path / "*.parquet"), "columns": ["label"], "image_column": "png"}},
        "transforms": ["decode", {"resize": {"size": [4, 4]}}],
        "batch_size": 5,
        "sampler": {"shuffle": True, "block_shuffle": True, "seed": 1},
    }
    with loader.Loader.local(job, workers=2) as dl:
        batches = list(dl)
    seen = []
    for b in batches:
        label, image = np.asarray(b["label"]), np.asarray(b["png"])
        assert image.dtype == np.uint8 and image.shape == (len(label), 3, 4, 4)
        for k, i in enumerate(label):
            assert (image[k, 0] == (i * 9) % 256).all() and (image[k, 1] == 100).all() and (image[k, 2] == 200).all()
        np.testing.assert_array_equal(label, b.indices)
        seen.extend(b.indices)
    assert sorted(seen) == list(range(17))


def test_a_text_column_a_missing_file_or_an_unread_codec_is_one_line(tmp_path):
    # Found while the spec is read (a ValueError, as for any bad spec),
    # before any process starts.
    write_files(tmp_path)
    bad = spec(tmp_path)
    bad["dataset"]["parquet"]["columns"] = ["x", "name"]
    with pytest.raises(ValueError) as e:
        loader.Loader.local(bad, workers=1)
    message = str(e.value)
    assert "column `name`" in message and "\n" not in message, message
    missing = spec(tmp_path)
    missing["dataset"]["parquet"]["files"] = str(tmp_path / "nothing-*.parquet")
    with pytest.raises(ValueError) as e:
        loader.Loader.local(missing, workers=1)
    assert "matches no file" in str(e.value), str(e.value)
    # A codec this build does not read is named before any worker starts.
    gzip = tmp_path / "gzip"
    gzip.mkdir()
    pq.write_table(pa.table({"y": pa.array([1, 2, 3], pa.int64())}), gzip / "a.parquet", compression="gzip")
    with pytest.raises(ValueError) as e:
        loader.Loader.local({"dataset": {"parquet": {"files": str(gzip / "a.parquet")}}, "batch_size": 2}, workers=1)
    assert "compressed with GZIP" in str(e.value) and "\n" not in str(e.value), str(e.value)
