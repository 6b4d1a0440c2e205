"""Atomic run-artifact writers."""
import json
import os

import numpy as np
import pytest

from lpdl_core.atomic import write_atomic, write_json
from lpdl_core.pipeline.run.results import partition_rows, write_rows


def test_json_and_csv_roundtrip(tmp_path):
    write_json(tmp_path / "a/m.json", {"acc": np.float32(0.5), "n": np.int64(3), "h": np.arange(3)})
    assert json.loads((tmp_path / "a/m.json").read_text()) == {"acc": 0.5, "n": 3, "h": [0, 1, 2]}
    write_rows(tmp_path / "c.csv", [{"epoch": 0, "acc": 1.0}, {"epoch": 1, "acc": 2.0, "extra": 3}])
    assert (tmp_path / "c.csv").read_text().splitlines() == ["epoch,acc,extra", "0,1.0,", "1,2.0,3"]


def test_failed_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "m.json"
    write_atomic(p, "old")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(p, "new")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["m.json"]


def test_partition_rows():
    rows = partition_rows(np.array([[3, 1], [0, 4]]), ("cat", "dog"))
    assert rows == [{"node": 0, "cat": 3, "dog": 1, "total": 4}, {"node": 1, "cat": 0, "dog": 4, "total": 4}]
    assert list(partition_rows(np.array([[1, 2]]))[0]) == ["node", "c0", "c1", "total"]
