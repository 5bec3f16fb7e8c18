#!/usr/bin/env python3
"""Static checks of deploy/Dockerfile, for machines with no docker or buildah
engine (run by deploy/check.sh). It does not build the image; it checks what
a build would trip on or get wrong:

- every FROM names a pinned image (a version tag or a digest, never
  `latest` or no tag); stage names are unique;
- every COPY --from names an earlier stage;
- the builder's Rust image is at least the workspace's rust-version;
- `cargo build -p` names packages of the workspace, and the binaries copied
  out of target/release are exactly the [[bin]] targets of those packages
  (read from the Cargo.tomls), all of which reach the runtime stage's PATH;
- the runtime stage runs as a non-root user, given numerically (so that
  Kubernetes' runAsNonRoot can verify it);
- the libjpeg-turbo packages the worker's build script links are installed
  (the -dev one to build, the library at run time), and every apt package
  named exists in the Debian release the images are based on (asked of
  this machine's apt when it runs that release; said when it cannot);
- .dockerignore keeps target/ out of the build context.

--self-test feeds known-bad variants of the Dockerfile and fails unless
each is rejected.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parent.parent


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def workspace() -> tuple[dict[str, list[str]], str]:
    """{package name: [its bin target names]} of the workspace, and its rust-version."""
    root = tomllib.loads((REPO / "Cargo.toml").read_text())
    packages = {}
    for member in root["workspace"]["members"]:
        manifest = tomllib.loads((REPO / member / "Cargo.toml").read_text())
        name = manifest["package"]["name"]
        bins = [b["name"] for b in manifest.get("bin", [])]
        if not bins and (REPO / member / "src" / "main.rs").exists():
            bins = [name]
        packages[name] = bins
    return packages, root["workspace"]["package"]["rust-version"]


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def apt_packages(run_args: str) -> list[str]:
    pkgs = []
    for cmd in re.split(r"&&|;", run_args):
        words = shlex.split(cmd)
        if len(words) >= 2 and words[0] == "apt-get" and "install" in words:
            pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return pkgs


_APT: dict[str, bool] = {}


def apt_has(package: str) -> bool:
    """Whether this machine's apt knows `package` (cached: apt-cache is slow)."""
    if package not in _APT:
        r = subprocess.run(["apt-cache", "show", "--no-all-versions", package], capture_output=True, text=True)
        _APT[package] = r.returncode == 0 and bool(r.stdout.strip())
    return _APT[package]


def check(text: str, dockerignore: str, apt_check: bool = True) -> tuple[list[str], list[str]]:
    """(errors, notes) for Dockerfile `text`."""
    errors, notes = [], []
    packages, rust_version = workspace()
    stages: list[dict] = []
    for instr, args in instructions(text):
        if instr == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", args, re.IGNORECASE)
            if not m:
                errors.append(f"FROM {args}: cannot parse")
                continue
            image, name = m.group(1), m.group(2)
            stages.append({"image": image, "name": name, "lines": [], "user": None})
            if any(image == s["name"] for s in stages[:-1] if s["name"]):
                continue
            repo_tag = image.split("@")[0]
            tag = repo_tag.rsplit(":", 1)[1] if ":" in repo_tag.rsplit("/", 1)[-1] else None
            if "@sha256:" not in image and (tag is None or tag == "latest" or not re.search(r"\d", tag)):
                errors.append(f"FROM {image}: not pinned (give a version tag or a digest)")
            if name and [s["name"] for s in stages].count(name) > 1:
                errors.append(f"stage name {name!r} used twice")
            continue
        if not stages:
            if instr != "ARG":
                errors.append(f"{instr} before the first FROM")
            continue
        stages[-1]["lines"].append((instr, args))
        if instr == "USER":
            stages[-1]["user"] = args

    if len(stages) < 2:
        errors.append(f"{len(stages)} stage(s): expected a builder stage and a runtime stage")
        return errors, notes
    builder_names = set()
    for i, stage in enumerate(stages):
        earlier = {s["name"] for s in stages[:i] if s["name"]} | {str(k) for k in range(i)}
        for instr, args in stage["lines"]:
            if instr == "COPY":
                for src in re.findall(r"--from=(\S+)", args):
                    if src not in earlier:
                        errors.append(f"COPY --from={src}: no earlier stage is named {src!r}")
            if instr == "RUN" and "cargo build" in args:
                m = re.search(r"rust:(\d+\.\d+(?:\.\d+)?)", stage["image"])
                if not m:
                    errors.append(f"builder FROM {stage['image']}: cannot read its Rust version")
                elif version_tuple(m.group(1)) < version_tuple(rust_version):
                    errors.append(f"builder FROM {stage['image']}: Rust {m.group(1)} < the workspace's rust-version {rust_version}")
                if "--release" not in args:
                    errors.append("cargo build without --release")
                build_cmd = re.search(r"cargo build[^&;]*", args).group(0)
                for pkg in re.findall(r"-p\s+(\S+)", build_cmd):
                    if pkg not in packages:
                        errors.append(f"cargo build -p {pkg}: no such package in the workspace")
                    else:
                        builder_names |= set(packages[pkg])
                        if not packages[pkg]:
                            errors.append(f"cargo build -p {pkg}: the package has no binary")
                copied = set(re.findall(r"target/release/([A-Za-z0-9_-]+)", args))
                if copied != builder_names:
                    errors.append(f"binaries copied out of target/release {sorted(copied)} are not the built "
                                  f"packages' [[bin]] targets {sorted(builder_names)}")
                if "libjpeg62-turbo-dev" not in " ".join(a for ins, a in stage["lines"] if ins == "RUN"):
                    errors.append("the builder stage does not install libjpeg62-turbo-dev (worker/build.rs links -ljpeg)")

    expected = set(packages.get("loader-server", [])) | set(packages.get("loader-worker", [])) | set(packages.get("loader-ctl", []))
    if expected != {"loader-server", "loader-worker", "loaderctl"}:
        errors.append(f"the workspace's binaries are now {sorted(expected)}: update the Dockerfile and this check")
    if builder_names != expected:
        errors.append(f"the builder builds {sorted(builder_names)}, expected {sorted(expected)}")

    runtime = stages[-1]
    final_copy = " ".join(a for ins, a in runtime["lines"] if ins == "COPY" and "--from=" in a)
    for b in sorted(expected):
        if not re.search(rf"/{re.escape(b)}(\s|$)", final_copy):
            errors.append(f"the runtime stage does not copy {b}")
    if "/usr/local/bin" not in final_copy:
        errors.append("the runtime stage does not copy the binaries onto PATH (/usr/local/bin)")
    user = runtime["user"]
    if user is None:
        errors.append("the runtime stage has no USER: it would run as root")
    else:
        uid = user.split(":")[0]
        if uid in ("0", "root"):
            errors.append(f"USER {user}: the runtime stage runs as root")
        elif not uid.isdigit():
            errors.append(f"USER {user}: give a numeric uid so runAsNonRoot can verify it")
    runtime_pkgs = [p for ins, a in runtime["lines"] if ins == "RUN" for p in apt_packages(a)]
    if "libjpeg62-turbo" not in runtime_pkgs:
        errors.append("the runtime stage does not install libjpeg62-turbo (libjpeg.so.62, which loader-worker links)")
    if not re.search(r"(^|\n)\s*/?target/?\s*(\n|$)", dockerignore):
        errors.append(".dockerignore does not exclude target/")

    if apt_check:
        all_pkgs = sorted({p for s in stages for ins, a in s["lines"] if ins == "RUN" for p in apt_packages(a)})
        codenames = {c for s in stages for c in re.findall(r"(bookworm|trixie|bullseye)", s["image"])}
        codenames |= {{"12": "bookworm", "13": "trixie", "11": "bullseye"}[m] for s in stages
                      for m in re.findall(r"^debian:(\d+)", s["image"]) if m in ("11", "12", "13")}
        here = ""
        try:
            here = re.search(r"VERSION_CODENAME=(\w+)", pathlib.Path("/etc/os-release").read_text()).group(1)
        except (OSError, AttributeError):
            pass
        if len(codenames) != 1:
            errors.append(f"the stages are based on Debian releases {sorted(codenames) or 'unknown'}: use one")
        elif here not in codenames:
            notes.append(f"apt packages {all_pkgs} not looked up: this machine runs {here or 'no Debian'}, the images {codenames.pop()}")
        else:
            for p in all_pkgs:
                if not apt_has(p):
                    errors.append(f"apt package {p!r} is not in Debian {here} (apt-cache show; run apt-get update if the lists are empty)")
            notes.append(f"apt packages {all_pkgs} exist in Debian {here}")
    return errors, notes


# Each variant must be rejected.
BREAKS = [
    ("an unpinned FROM", lambda t: t.replace("FROM debian:12.11-slim", "FROM debian:latest")),
    ("a runtime running as root", lambda t: t.replace("USER 10001:10001", "USER root")),
    ("no USER", lambda t: re.sub(r"\nUSER .*", "\n", t)),
    ("COPY --from an unknown stage", lambda t: t.replace("COPY --from=builder", "COPY --from=build")),
    ("a binary name not in the workspace", lambda t: t.replace("target/release/loaderctl", "target/release/loader-ctl")),
    ("a package not in the workspace", lambda t: t.replace("-p loader-ctl", "-p loaderctl")),
    ("no libjpeg at run time", lambda t: t.replace("install -y --no-install-recommends libjpeg62-turbo ca", "install -y --no-install-recommends ca")),
    ("a Rust older than the workspace's", lambda t: t.replace("rust:1.90.0-slim", "rust:1.85.0-slim")),
    ("an apt package that does not exist", lambda t: t.replace("libjpeg62-turbo ca-certificates", "libjpeg62-turbo ca-certificates libloader-nonexistent")),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    text = (REPO / "deploy" / "Dockerfile").read_text()
    ignore = (REPO / ".dockerignore").read_text()
    errors, notes = check(text, ignore)
    for n in notes:
        print(f"     note: {n}")
    failed = 0
    if errors:
        failed += 1
        print("FAIL deploy/Dockerfile (static checks; not built)")
        for e in errors:
            print(f"  {e}")
    else:
        print("ok   deploy/Dockerfile: stages checked statically (pins, stages, binaries, non-root user, packages); not built")
    if args.self_test:
        apt_ok = any("exist in Debian" in n for n in notes)
        missed = []
        for what, change in BREAKS:
            broken = change(text)
            if broken == text:
                missed.append(f"{what}: the variant did not change the Dockerfile (update BREAKS)")
                continue
            if "apt package" in what and not apt_ok:
                continue
            if not check(broken, ignore, apt_check=apt_ok)[0]:
                missed.append(f"{what} was NOT caught")
        if missed:
            failed += 1
            print("FAIL Dockerfile self-test")
            for m in missed:
                print(f"  {m}")
        else:
            print(f"ok   Dockerfile self-test: {len(BREAKS)} known-bad variants were all rejected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
