"""The build of the wheel: everything is in pyproject.toml, but for one step it cannot say.

The example job files and their documents (``examples/``: ``digits_mlp.conf``, SINGA's
released examples, the rnnlm user module) are copied into the wheel as package data,
``paramserver/examples/``, so that an installed paramserver runs them from any folder
(``paramserver train digits_mlp``); in a checkout they are read where they are. So are the
documents (``docs/*.md``, as ``paramserver/docs/``), which messages name. setuptools'
``package-data`` takes only files inside a package, and the examples stay at the
repository's root, where SINGA's paths (``examples/mnist/...``) and the README expect them.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
EXAMPLES = ROOT / "examples"
#: What of ``examples/`` ships: job files, their documents and scripts (not the data and
#: workspaces that runs make there).
SHIPPED = ("*.conf", "*.md", "*.py")
#: The documents (``docs/*.md``), which messages and the README name: ``paramserver/docs``.
DOCS = ROOT / "docs"
#: SINGA's licence and notice, which its job files (examples/singa, examples/rnnlm) go with.
SINGA = ROOT / "tests" / "data" / "singa"


class BuildWithExamples(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "paramserver" / "examples"
        for pattern in SHIPPED:
            for source in sorted(EXAMPLES.rglob(pattern)):
                dest = target / source.relative_to(EXAMPLES)
                self.mkpath(str(dest.parent))
                self.copy_file(str(source), str(dest))
        for name in ("LICENSE", "NOTICE"):
            self.copy_file(str(SINGA / name), str(target / "singa" / name))
        docs = Path(self.build_lib) / "paramserver" / "docs"
        self.mkpath(str(docs))
        for source in sorted(DOCS.glob("*.md")):
            self.copy_file(str(source), str(docs / source.name))


setup(cmdclass={"build_py": BuildWithExamples})
