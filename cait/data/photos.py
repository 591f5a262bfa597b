"""Real photos to look at an ImageNet model with, taken from packages this project already installs
(scikit-image's sample data and gradio's bundled demo images), each photo once, with its licence."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Photo:
    name: str  # short name, used as file stem and caption
    package: str  # the installed package that ships the file
    file: str  # path inside that package
    credit: str  # author and licence, as the package documents them

    @property
    def path(self) -> Path | None:
        """The file in the installed package, or None when the package or the file is missing."""
        spec = importlib.util.find_spec(self.package)  # finds the package without importing it (gradio: ~5 s)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / self.file
        return path if path.is_file() else None


# Credits and licences as scikit-image's `skimage.data` docstrings state them; gradio ships its demo
# images (gradio.media.get_image) inside its Apache-2.0 package without naming author or licence per image.
_GRADIO = "bundled with gradio (Apache-2.0 package; no author or licence given for the image itself)"
PHOTOS: tuple[Photo, ...] = (
    Photo("chelsea", "skimage", "data/chelsea.png", "Chelsea the cat, Stefan van der Walt, CC0 (scikit-image data)"),
    Photo("astronaut", "skimage", "data/astronaut.png", "Eileen Collins, NASA, public domain (scikit-image data)"),
    Photo(
        "coffee",
        "skimage",
        "data/coffee.png",
        "Rachel Michetti, courtesy of Pikolo Espresso Bar, CC0 (scikit-image data)",
    ),
    Photo(
        "rocket", "skimage", "data/rocket.jpg", "DSCOVR launch on Falcon 9, SpaceX, public domain (scikit-image data)"
    ),
    Photo("cheetah", "gradio", "media_assets/images/cheetah.jpg", _GRADIO),
    Photo("lion", "gradio", "media_assets/images/lion.jpg", _GRADIO),
    Photo("tower", "gradio", "media_assets/images/tower.jpg", _GRADIO),
)


def available_photos() -> list[tuple[Photo, Path]]:
    """The photos present in this installation, in PHOTOS order, with their files."""
    found = [(photo, photo.path) for photo in PHOTOS]
    return [(photo, path) for photo, path in found if path is not None]
