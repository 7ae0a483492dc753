"""pip install ./python: the Swarm trainer SDK (package `swarm`).

The gRPC/protobuf stubs are generated from ../proto by the install itself
(build_stubs.sh: protoc and grpc_python_plugin, Debian packages
protobuf-compiler and protobuf-compiler-grpc), and swarm.__version__ is the
release version of the top CMakeLists.txt, so it matches the daemon's
`swarm-client --version`. Nothing is downloaded: with Debian's setuptools,

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation ./python

works offline (grpcio, protobuf and numpy come from Debian's packages).
"""
import os
import re
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def release_version():
    """The project(swarm VERSION x.y.z) of the top CMakeLists.txt."""
    path = os.path.join(ROOT, "CMakeLists.txt")
    try:
        with open(path, encoding="utf-8") as f:
            match = re.search(r"project\(swarm VERSION ([0-9.]+)", f.read())
    except OSError as e:
        raise SystemExit(f"setup.py: cannot read {path} ({e}): install from "
                         "a Swarm source tree (pip install ./python)")
    if match is None:
        raise SystemExit(f"setup.py: no 'project(swarm VERSION ...)' in {path}")
    return match.group(1)


class BuildWithStubs(build_py):
    """build_py, plus swarm/_proto (generated) and swarm/_version.py."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "swarm")
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(["bash", os.path.join(HERE, "build_stubs.sh"), out],
                           check=True)
            proto = os.path.join(out, "swarm", "_proto")
            os.makedirs(os.path.join(target, "_proto"), exist_ok=True)
            for name in sorted(os.listdir(proto)):
                if name.endswith(".py"):
                    self.copy_file(os.path.join(proto, name),
                                   os.path.join(target, "_proto", name))
            self.copy_file(os.path.join(out, "swarm", "_version.py"),
                           os.path.join(target, "_version.py"))


setup(
    name="swarm-sdk",
    version=release_version(),
    description="Swarm trainer SDK: your own training code as a Swarm "
                "site's learner",
    packages=["swarm"],
    python_requires=">=3.9",
    install_requires=["grpcio", "protobuf", "numpy"],
    extras_require={"torch": ["torch"]},
    cmdclass={"build_py": BuildWithStubs},
)
