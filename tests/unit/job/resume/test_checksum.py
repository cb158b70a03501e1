"""A checkpoint's checksum (ddpscale.job.resume.checksum): signed once complete, checked before a
resume, the previous one kept; plain files, no torch."""

from __future__ import annotations

import json

from ddpscale.job.resume import checksum


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_signed_file_matches_and_any_change_of_it_is_named(tmp_path):
    ckpt = write(tmp_path / "last.ckpt", bytes(range(256)) * 5000)  # more than one chunk
    assert checksum.mismatch(ckpt) == checksum.UNSIGNED
    checksum.sign(ckpt)
    assert json.loads((tmp_path / "last.ckpt.sha256").read_text())["size"] == 256 * 5000
    assert checksum.mismatch(ckpt) is None
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    ckpt.write_bytes(bytes(data))
    assert checksum.mismatch(ckpt) == "its bytes differ from those written (sha256 mismatch)"
    ckpt.write_bytes(bytes(data[:1000]))
    assert checksum.mismatch(ckpt) == "1000 bytes, but 1280000 were written"


def test_a_sidecar_of_another_shape_is_named_not_raised(tmp_path):
    ckpt = write(tmp_path / "last.ckpt", b"x")
    for content, said in [("{cut", "is unreadable"), ("[1]", "is not one ddpscale writes"),
                          ('{"size": "1", "sha256": "a"}', "is not one ddpscale writes")]:
        (tmp_path / "last.ckpt.sha256").write_text(content)
        assert checksum.mismatch(ckpt) == f"its checksum file last.ckpt.sha256 {said}"


def test_rotate_keeps_the_replaced_one_signed_and_does_nothing_without_one(tmp_path):
    last, previous = tmp_path / "last.ckpt", tmp_path / "previous.ckpt"
    checksum.rotate(last, previous)
    assert list(tmp_path.iterdir()) == []
    checksum.sign(write(last, b"epoch 0"))
    checksum.rotate(last, previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous.ckpt", "previous.ckpt.sha256"]
    assert previous.read_bytes() == b"epoch 0" and checksum.mismatch(previous) is None
    write(last, b"epoch 1")  # unsigned: a kill before its sidecar
    checksum.rotate(last, previous)
    assert previous.read_bytes() == b"epoch 1" and checksum.mismatch(previous) == checksum.UNSIGNED, \
        "the replaced one carried the sidecar of the one before it"


def test_a_damaged_one_is_set_aside_with_its_sidecar_keeping_earlier_ones(tmp_path):
    last = write(tmp_path / "last.ckpt", b"one")
    checksum.sign(last)
    assert checksum.put_aside(last).name == "last.ckpt.damaged"
    write(last, b"two")
    assert checksum.put_aside(last).name == "last.ckpt.damaged.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt.damaged", "last.ckpt.damaged.1",
                                                          "last.ckpt.sha256.damaged"]
    assert (tmp_path / "last.ckpt.damaged").read_bytes() == b"one"
