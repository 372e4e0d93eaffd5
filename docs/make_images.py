"""Regenerate every image under docs/ from the current CLI and app.

    python docs/make_images.py            # all of them
    python docs/make_images.py --cli      # only the CLI's plots (matplotlib; seconds)
    python docs/make_images.py --app      # only the app's screenshots (marimo + Chromium; about a minute)

The CLI plots are the commands the docs print beside them (docs/sweeps-and-planner.md, docs/labs.md), run
through ``python -m trainfit``. The app screenshots are taken by the browser test, tests/test_app_browser.py,
which starts ``trainfit app``, drives each view in headless Chromium (Debian's ``chromium`` through
Playwright; ``bash .ci/install-browser.sh`` installs it) and saves one screenshot per view when
``TRAINFIT_APP_SCREENSHOTS`` names a folder. A screenshot is therefore only kept from a run whose every
on-screen number matched the library's; a failed run leaves the old images in place.

Needs the ``plot`` extra (matplotlib) for the plots and the ``app`` and ``test`` extras (marimo, playwright,
pytest) plus Chromium and a colour emoji font for the screenshots (the app's title and track names carry
emoji; Debian: ``apt-get install chromium fonts-noto-color-emoji``). tests/test_architecture.py checks that IMAGES names every
``docs/*.png``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent

#: CLI plots: image -> the command's arguments after ``trainfit`` (``{out}`` is the image's path)
CLI_IMAGES: dict[str, list[str]] = {
    "frontier-llama-3.1-8b-h100.png": ["frontier", "llama-3.1-8b", "h100", "--precision", "bf16", "--checkpointing",
                                       "selective", "--dp", "8", "--zero", "3", "--seq", "4096", "--headroom", "0.1",
                                       "--plot", "{out}"],
    "lab-stack.png": ["lab", "stack", "cloud", "--plot", "{out}"],
    "lab-frontier.png": ["lab", "frontier", "cloud", "--strategy", "mixed_checkpointed", "--plot", "{out}"],
}
#: app screenshots, by the name the browser test saves them under (``app-<view>.png``)
APP_IMAGES: tuple[str, ...] = ("app-stack.png", "app-frontier.png", "app-plan.png", "app-free.png",
                               "app-free-plan.png")
IMAGES: tuple[str, ...] = (*CLI_IMAGES, *APP_IMAGES)


def make_cli_images() -> None:
    for name, args in CLI_IMAGES.items():
        out = DOCS / name
        argv = [sys.executable, "-m", "trainfit", *(a.format(out=out) for a in args)]
        print("make_images:", "trainfit", *(a.format(out=f"docs/{name}") for a in args), flush=True)
        subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def require_emoji_font() -> None:
    """Without a colour emoji font Chromium draws the app's emoji as empty boxes; refuse rather than commit them."""
    if shutil.which("fc-list") is None:
        return  # no fontconfig to ask; Chromium finds fonts its own way
    fonts = subprocess.run(["fc-list", ":lang=und-zsye", "family"], capture_output=True, text=True).stdout
    if not fonts.strip():
        raise SystemExit("make_images: no colour emoji font (the app's emoji would be empty boxes); "
                         "install one, e.g. apt-get install fonts-noto-color-emoji")


def make_app_images() -> None:
    require_emoji_font()
    with tempfile.TemporaryDirectory(prefix="trainfit-shots-") as tmp:
        env = {**os.environ, "TRAINFIT_APP_SCREENSHOTS": tmp, "TRAINFIT_REQUIRE_BROWSER": "1"}
        print("make_images: tests/test_app_browser.py with TRAINFIT_APP_SCREENSHOTS", flush=True)
        subprocess.run([sys.executable, "-m", "pytest", "tests/test_app_browser.py", "-x", "-q", "-p", "no:cacheprovider"],
                       cwd=REPO, env=env, check=True)
        missing = [n for n in APP_IMAGES if not (Path(tmp) / n).is_file()]
        if missing:
            raise SystemExit(f"make_images: the browser test saved no {', '.join(missing)}; docs/ left unchanged")
        for name in APP_IMAGES:
            shutil.copyfile(Path(tmp) / name, DOCS / name)
            print(f"make_images: docs/{name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", action="store_true", help="only the CLI's plots")
    parser.add_argument("--app", action="store_true", help="only the app's screenshots")
    args = parser.parse_args()
    both = not (args.cli or args.app)
    if args.cli or both:
        make_cli_images()
    if args.app or both:
        make_app_images()


if __name__ == "__main__":
    main()
