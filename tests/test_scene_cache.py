"""The scene cache: the same pixels as rendering, rebuilt when the generator changes, never a half-written
file taken for complete, one build for parallel readers, clear errors. Every test uses its own cache
directory and a few dozen scenes."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import cait.data.scene_cache as scene_cache
from cait.data import DataError, FashionMNISTScenes, build_dataset
from cait.data.scene_cache import cache_path, cached_pixels, lock_path
from cait.runtime import CACHE_ENV, user_cache_dir

N = 30


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(scene_cache, "CHUNK", 8)  # several chunks even for a few scenes
    return tmp_path / "cache"


def _builds(monkeypatch) -> list:
    """Record every build (the real one still runs)."""
    calls, real = [], scene_cache._build
    monkeypatch.setattr(scene_cache, "_build", lambda *a: (calls.append(a[1]), real(*a)))
    return calls


def test_cached_pixels_equal_rendering_and_are_reused(own_cache, monkeypatch):
    builds = _builds(monkeypatch)
    scenes = FashionMNISTScenes("val", subset=N, cache=True)
    assert scenes.pixels.shape == (N, 64, 64, 3) and scenes.pixels.dtype == np.uint8
    assert isinstance(scenes.pixels, np.memmap) and not scenes.pixels.flags.writeable
    for i in range(N):
        assert np.array_equal(scenes.pixels[i], scenes.render(i)), i
    image, label = scenes[5]
    assert np.array_equal(np.asarray(image), scenes.render(5)) and label == scenes.labels[5]
    assert [p.name for p in own_cache.glob("*.npy")] == [cache_path(scenes).name]
    again = build_dataset("fashion-mnist-scenes", "val", subset=N, cache=True)
    assert np.array_equal(again.pixels, scenes.pixels) and len(builds) == 1
    # another n is another set of layouts, so another file; the first stays
    FashionMNISTScenes("val", subset=N + 1, cache=True)
    assert len(builds) == 2 and len(list(own_cache.glob("*.npy"))) == 2


@pytest.mark.parametrize("change", ["version", "garments", "side range", "seed"])
def test_any_generator_change_renders_a_new_file(own_cache, monkeypatch, change):
    builds = _builds(monkeypatch)
    first = FashionMNISTScenes("val", subset=N, cache=True)
    old = cache_path(first)
    if change == "version":
        monkeypatch.setattr(FashionMNISTScenes, "GENERATOR_VERSION", FashionMNISTScenes.GENERATOR_VERSION + 1)
    elif change == "side range":
        monkeypatch.setattr(FashionMNISTScenes, "MAX_SIDE", 0.6)
    scenes = FashionMNISTScenes("val", subset=N, seed=1 if change == "seed" else 0)
    if change == "garments":
        scenes.garments = scenes.garments.copy()
        scenes.garments[3] = 255 - scenes.garments[3]
    new = cache_path(scenes)
    assert new != old
    assert np.array_equal(scenes.pixels[3], scenes.render(3)) and len(builds) == 2
    if change != "version":  # (a new version stands for a new render(); this test's render() is the old one)
        assert not np.array_equal(scenes.pixels[3], first.render(3))
    # a stale file of the same scenes is removed; another seed's file is other scenes and stays
    assert old.exists() == (change == "seed") and new.exists()
    assert lock_path(old).exists() == (change == "seed")  # a removed file's lock goes with it


def test_an_interrupted_build_leaves_nothing_that_is_taken_for_done(own_cache, monkeypatch):
    real, done = scene_cache._render_range, []

    def dies_on_third_chunk(scenes, start, stop):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(start)
        return real(scenes, start, stop)

    monkeypatch.setattr(scene_cache, "_render_range", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        FashionMNISTScenes("val", subset=N, cache=True)
    assert not list(own_cache.glob("*.npy")) + list(own_cache.glob("*.tmp*"))  # neither final nor temporary
    monkeypatch.setattr(scene_cache, "_render_range", real)
    scenes = FashionMNISTScenes("val", subset=N)
    path = cache_path(scenes)
    # a process killed outright (no cleanup) leaves its temporary file: ignored, then removed
    path.with_name(path.name + ".tmp4242").write_bytes(b"\x93NUMPY half")
    # a final-named file that is not the full array (damaged disk, manual copy) is rebuilt, never read
    np.save(path, np.zeros((2, 64, 64, 3), np.uint8))
    assert np.array_equal(scenes.pixels[N - 1], scenes.render(N - 1))
    assert sorted(p.name for p in own_cache.glob("*.npy*") if p.suffix != ".lock") == [path.name]


def test_parallel_readers_wait_for_one_build(monkeypatch):
    builds = _builds(monkeypatch)
    scenes = [FashionMNISTScenes("val", subset=N) for _ in range(3)]
    results: list = [None] * 3
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, cached_pixels(scenes[k]))) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert all(np.array_equal(r, results[0]) for r in results)


def test_rendering_in_processes_gives_the_same_file(own_cache, monkeypatch):
    monkeypatch.setattr(scene_cache, "PARALLEL_FROM", 1)
    scenes = FashionMNISTScenes("val", subset=N)
    parallel = np.array(cached_pixels(scenes, processes=2))
    cache_path(scenes).unlink()
    assert np.array_equal(parallel, cached_pixels(scenes, processes=1))


def test_a_pickled_dataset_maps_the_file_instead_of_carrying_it():
    scenes = FashionMNISTScenes("val", subset=N, cache=True)
    blob = pickle.dumps(scenes)
    assert len(blob) < scenes.garments.nbytes + 2 * scenes.pixels.nbytes // 3  # the garments, not the pixels
    copy = pickle.loads(blob)
    assert isinstance(copy.pixels, np.memmap) and np.array_equal(copy.pixels, scenes.pixels)


def test_unusable_cache_dir_is_one_clear_line(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(DataError, match=f"set {CACHE_ENV} to a writable directory") as info:
        FashionMNISTScenes("val", subset=N, cache=True)
    assert "\n" not in str(info.value)


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache_dir() == tmp_path / "cait-lens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "cait-lens"
