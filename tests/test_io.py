import os

import pytest
import torch

from fedpipe.io import atomic_path, load_tensors, md5_file, read_json, save_tensors, write_json


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-written")
            raise RuntimeError("killed")
    assert read_json(target) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left behind


def test_outputs_get_normal_permissions(tmp_path):
    write_json(tmp_path / "m.json", {})
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_safetensors_round_trip_and_md5(tmp_path):
    t = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    save_tensors(tmp_path / "t.safetensors", t, {"k": "{\"v\": 1}"})
    assert torch.equal(load_tensors(tmp_path / "t.safetensors")["w"], t["w"])
    (tmp_path / "x").write_bytes(b"abc")
    assert md5_file(tmp_path / "x") == "900150983cd24fb0d6963f7d28e17f72"


def test_names_that_share_a_tensor_are_saved_as_copies(tmp_path):
    """A state that holds one tensor under two names (PerAda's w^0 snapshot once did) is saved, not
    refused by safetensors, and reads back as two equal tensors; distinct tensors stay untouched."""
    shared = torch.arange(6.0).reshape(2, 3)
    view = torch.zeros(4)
    tensors = {"w/bn.running_mean": shared, "x/initial/bn.running_mean": shared,
               "other": torch.ones(2), "empty": torch.zeros(0), "empty2": torch.zeros(0),
               "part_a": view[:2], "part_b": view[2:]}
    save_tensors(tmp_path / "s.safetensors", tensors)
    back = load_tensors(tmp_path / "s.safetensors")
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
