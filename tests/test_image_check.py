"""A host checks the images its processes report complete against their
files (ckpt/image_check.py): the coordinator for its own host, each
agent for its own, before the answer goes on."""

import pytest

from ckpt import image_check
from ckpt.barrier import PhaseError


def _image(directory, name, size):
    (directory / name).write_bytes(b"x" * size)
    return name


def test_images_of_the_reported_sizes_pass(tmp_path):
    answers = {"p1": {"file": _image(tmp_path, "a.img", 10), "size": "10"},
               "p2": {"file": _image(tmp_path, "b.img", 0), "size": "0"},
               # a forked writer's WRITE answer: no image yet, its SYNC says
               "p3": {"forked": "123", "file": "c.img"},
               "p4": {}}
    image_check.check(tmp_path, answers)


@pytest.mark.parametrize("keys, expected", [
    ({"file": "a.img", "size": "11"}, "image a.img has 10 bytes, p1 reported 11"),
    ({"file": "gone.img", "size": "0"}, "image gone.img of p1 is not in"),
    ({"file": "../a.img", "size": "10"}, "p1 reported a bad image name '../a.img'"),
    ({"file": ".hidden", "size": "10"}, "p1 reported a bad image name '.hidden'"),
    ({"size": "10"}, "p1 reported a bad image name ''"),
])
def test_an_image_unlike_its_report_fails_naming_it(tmp_path, keys, expected):
    _image(tmp_path, "a.img", 10)
    with pytest.raises(PhaseError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        image_check.check(tmp_path, {"p1": keys})


def test_the_first_bad_image_is_named_with_its_process(tmp_path):
    good = _image(tmp_path, "a.img", 3)
    answers = {"p1": {"file": good, "size": "3"}, "p2": {"file": good, "size": "4"}}
    with pytest.raises(PhaseError, match="rank two reported 4"):
        image_check.check(tmp_path, answers, describe={"p1": "rank one", "p2": "rank two"}.get)
