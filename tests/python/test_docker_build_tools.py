"""docker/build-tools.sh, the builder stage, with a stand-in cmake: the tools
are laid out with every library they load (glibc and its loader included),
and the launchers in bin/ run them on that loader with their arguments."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from docker_support import DOCKER, write_exec

FAKE_CMAKE = r"""#!/bin/sh
echo "cmake $*" >>"$CMAKE_LOG"
if [ "$1" = "--build" ]; then
  mkdir -p "$2/patcher" "$2/kvstore"
  cp /bin/echo "$2/patcher/overlay"
  cp /bin/echo "$2/kvstore/kvstore"
fi
"""


@pytest.fixture
def built(tmp_path) -> tuple[Path, Path, subprocess.CompletedProcess]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    write_exec(stubs / "cmake", FAKE_CMAKE)
    log = tmp_path / "cmake.log"
    out = tmp_path / "opt" / "kvtier"
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "build", "--src", str(tmp_path),
         "--build", str(tmp_path / "b"), "--out", str(out)],
        env={"PATH": f"{stubs}:/usr/bin:/bin", "CMAKE_LOG": str(log)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out, log, res


def test_layout_and_targets(built):
    out, log, res = built
    assert res.returncode == 0, res.stderr
    assert "--target overlay kvstore" in log.read_text()
    assert sorted(p.name for p in (out / "libexec").iterdir()) == ["kvstore", "overlay"]
    libs = {p.name for p in (out / "lib").iterdir()}
    assert "libc.so.6" in libs
    assert any(n.startswith("ld-linux") for n in libs)


def test_launchers_use_the_bundled_loader(built, tmp_path):
    out, _, res = built
    assert res.returncode == 0, res.stderr
    # Moved elsewhere (as COPY --from=builder does), reached through a link.
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    link = tmp_path / "overlay-link"
    link.symlink_to(moved / "bin" / "overlay")
    done = subprocess.run(
        [str(link), "apply", "--root", "/a b"],
        capture_output=True, text=True, check=True, env={},
    )  # fmt: skip
    assert done.stdout == "apply --root /a b\n"
    text = (moved / "bin" / "kvstore").read_text()
    assert '"$here/../lib/ld-linux' in text and "--library-path" in text


def test_package_list_is_setup_sh(tmp_path):
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "packages"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pkgs = res.stdout.split()
    assert "shellcheck" in pkgs and "cmake" in pkgs
    assert len(pkgs) == len(set(pkgs))


def test_usage_errors():
    res = subprocess.run(
        [str(DOCKER / "build-tools.sh"), "build", "--src", "/x"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 2 and "needs --src, --build and --out" in res.stderr
