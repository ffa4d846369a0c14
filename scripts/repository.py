"""The course's repository URL, kept in one place: ``repository.url`` in ``_config.yml``.

The book's launch and repository buttons read it there. Everything else that names the
repository installs the package from it, as ``course-lib @ git+<url>``: the first code
cell of every notebook (the Colab install cell), ``README.md`` and ``book/setup.md``.
This script writes the URL into all of them, or lists the places that disagree.

    python scripts/repository.py set https://github.com/OWNER/NAME   (make set-repository URL=...)
    python scripts/repository.py check                              (exit status 1 on a disagreement)
"""

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "_config.yml"
INSTALL_LINE = re.compile(r"course-lib @ git\+(?P<url>[^\s\"'\\]+)")
# Colab opens notebooks from GitHub only (its launch links are .../github/OWNER/NAME/blob/...).
GITHUB_REPOSITORY = re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
CONFIG_URL_LINE = re.compile(r"(?m)^(repository:\n(?:[ \t]+.*\n)*?[ \t]+url:[ \t]*)(\S+)")


def places(root=ROOT):
    """Every file besides _config.yml that names the repository."""
    root = Path(root)
    return [root / "README.md", root / "book" / "setup.md", *sorted((root / "notebooks").glob("*.ipynb"))]


def configured_url(root=ROOT):
    path = Path(root) / CONFIG
    url = (yaml.safe_load(path.read_text(encoding="utf-8")).get("repository") or {}).get("url")
    if not url:
        raise ValueError(f"{path} has no repository.url")
    return url


def first_code_cell(notebook_path):
    cells = json.loads(Path(notebook_path).read_text(encoding="utf-8"))["cells"]
    code = next((cell for cell in cells if cell["cell_type"] == "code"), None)
    return "".join(code["source"]) if code else ""


def disagreements(root=ROOT):
    """What names another repository than _config.yml, or names none where it must:
    a list of sentences, empty when every place agrees."""
    url = configured_url(root)
    found = []
    for path in places(root):
        name = path.relative_to(root).as_posix()
        urls = [match["url"] for match in INSTALL_LINE.finditer(path.read_text(encoding="utf-8"))]
        if not urls:
            found.append(f"{name}: no `course-lib @ git+{url}`")
        found += [f"{name}: names {other}, not {url} ({CONFIG})" for other in urls if other != url]
        if path.suffix == ".ipynb" and f"course-lib @ git+{url}" not in first_code_cell(path):
            found.append(f"{name}: its first code cell does not install `course-lib @ git+{url}`")
    return found


def set_url(url, root=ROOT):
    """Write ``url`` into _config.yml and every place that installs the package."""
    if not GITHUB_REPOSITORY.fullmatch(url) or url.endswith(".git"):
        raise ValueError(f"{url!r} is not a GitHub repository URL of the form https://github.com/OWNER/NAME")
    config = Path(root) / CONFIG
    text, count = CONFIG_URL_LINE.subn(lambda match: match[1] + url, config.read_text(encoding="utf-8"))
    if count != 1:
        raise ValueError(f"{config}: no `url:` line under `repository:` to rewrite")
    config.write_text(text, encoding="utf-8")
    for path in places(root):
        text = path.read_text(encoding="utf-8")
        path.write_text(INSTALL_LINE.sub(f"course-lib @ git+{url}", text), encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="list the places that name another repository")
    set_parser = commands.add_parser("set", help="write a new repository URL everywhere")
    set_parser.add_argument("url", help="https://github.com/OWNER/NAME")
    args = parser.parse_args(argv)
    if args.command == "set":
        try:
            set_url(args.url)
        except ValueError as error:
            raise SystemExit(str(error))
    found = disagreements()
    for line in found:
        print(line, file=sys.stderr)
    if found:
        raise SystemExit(1)
    print(f"every place names {configured_url()}")


if __name__ == "__main__":
    main()
