"""bench/make_textured_dataset.py (issue 38): counts, label geometry, shapes, determinism."""

import hashlib

import cv2
import numpy as np
import pytest

from bench import make_textured_dataset as textured
from bench.release_reference import convergence


def _digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def _labels(root, split):
    return {p.stem: np.loadtxt(p, ndmin=2) for p in sorted((root / "labels" / split).glob("*.txt"))}


def test_counts_geometry_and_yaml(tmp_path):
    yaml_path = textured.make_textured_dataset(tmp_path / "d", n_train=40, n_val=8, seed=3)
    root = tmp_path / "d"
    assert yaml_path.read_text().startswith("path: .\ntrain: images/train\nval: images/val\nnc: 3\n")
    for split, n in (("train", 40), ("val", 8)):
        images = sorted((root / "images" / split).glob("*.jpg"))
        assert [p.stem for p in images] == [f"{i:05d}" for i in range(n)]
        labels = _labels(root, split)
        assert list(labels) == [p.stem for p in images]
        for stem, rows in labels.items():
            img = cv2.imread(str(root / "images" / split / f"{stem}.jpg"))
            assert img.shape == (240, 320, 3)
            assert 1 <= len(rows) <= 5
            cls, xc, yc, w, h = rows.T
            assert set(cls) <= {0, 1, 2}
            side_x, side_y = w * 320, h * 240
            np.testing.assert_allclose(side_x, side_y, atol=1e-3)  # a square in pixels
            assert (side_x >= 20 - 1e-3).all() and (side_x < 160).all()
            assert np.allclose(side_x, np.rint(side_x), atol=1e-3)  # whole pixels
            x0, y0 = (xc - w / 2) * 320, (yc - h / 2) * 240
            assert (x0 > -1e-3).all() and (y0 > -1e-3).all()
            assert (x0 + side_x < 320 + 1e-3).all() and (y0 + side_y < 240 + 1e-3).all()
    all_cls = np.concatenate([r[:, 0] for r in _labels(root, "train").values()])
    assert set(all_cls) == {0, 1, 2}


def test_deterministic_per_seed(tmp_path):
    textured.make_textured_dataset(tmp_path / "a", n_train=5, n_val=2, seed=7)
    textured.make_textured_dataset(tmp_path / "b", n_train=5, n_val=2, seed=7)
    textured.make_textured_dataset(tmp_path / "c", n_train=5, n_val=2, seed=8)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b") != _digest(tmp_path / "c")


def test_shape_masks():
    disk, square, tri = (textured.shape_mask(c, 20) for c in range(3))
    assert square.all()
    assert disk.sum() == pytest.approx(np.pi * 100, rel=0.03) and not disk[0, 0] and disk[10, 0]
    assert tri[-1].all() and tri[0].sum() <= 2 and tri[0, 9] and not tri[0, 0]  # apex top centre
    assert 200 <= tri.sum() <= 230  # half the square, plus the pixels the edges cut
    # every mask touches all four sides of its square: the label is its bounding square
    for m in (disk, square, tri):
        assert m[0].any() and m[-1].any() and m[:, 0].any() and m[:, -1].any()


def test_single_object_pixels_match_the_label():
    rng = np.random.default_rng(11)
    for _ in range(30):
        img, objects = textured.make_image(rng, 240, 320)
        cls, x0, y0, side = objects[-1]  # the last one drawn is never covered
        patch = img[y0 : y0 + side, x0 : x0 + side]
        colour = patch[textured.shape_mask(cls, side)]
        assert (colour == colour[0]).all()


def test_background_is_smooth_noise():
    bg = textured.textured_background(np.random.default_rng(0), 240, 320).astype(np.float64)
    assert bg.std() > 15  # noise, not a flat field
    assert np.abs(np.diff(bg, axis=1)).mean() < 10  # smooth: per-pixel noise would differ by ~85


def test_too_small_image_is_refused(capsys, tmp_path):
    assert textured.main([str(tmp_path / "x"), "--width", "100", "--height", "100", "--n-train", "1"]) == 2
    assert "smaller than the largest side" in capsys.readouterr().err


def test_convergence_data_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "sys.argv",
        [
            "convergence.py",
            "data",
            str(tmp_path / "t"),
            "--kind",
            "textured",
            "--n-train",
            "3",
            "--n-val",
            "1",
        ],
    )
    assert convergence.main() == 0
    text = (tmp_path / "t" / "data.yaml").read_text()
    assert f"path: {(tmp_path / 't').resolve()}\n" in text and "  - triangle\n" in text
