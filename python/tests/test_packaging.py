"""The tests run against the installed package, and the package holds every file it needs.

scripts/test-python.sh builds a wheel, installs it and runs pytest from outside the source tree; these
tests fail when that breaks down: seqattn imported from python/seqattn (the source tree on sys.path, or an
editable install), a file of python/seqattn missing from the wheel, or an extension built without the
XLA FFI handlers although jaxlib is a build requirement.
"""

import pathlib
import sys

import seqattn

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "seqattn"
INSTALLED = pathlib.Path(seqattn.__file__).resolve().parent


def test_the_installed_package_is_tested_not_the_source_tree():
    assert INSTALLED != SOURCE, (
        f"seqattn was imported from the source tree ({INSTALLED}); run the tests through scripts/test-python.sh, "
        "which installs the wheel and runs them from outside the source tree"
    )


def test_the_installed_package_holds_every_file_of_the_source_package():
    expected = sorted(
        p.relative_to(SOURCE)
        for p in SOURCE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so", ".pyd")
    )
    assert pathlib.Path("__init__.py") in expected
    missing = [str(p) for p in expected if not (INSTALLED / p).is_file()]
    assert not missing, f"files of python/seqattn missing from the installed package {INSTALLED}: {missing}"


def test_the_extension_is_installed_inside_the_package():
    core = pathlib.Path(seqattn._core.__file__).resolve()
    assert core.parent == INSTALLED, f"seqattn._core loaded from {core}, not from the installed package"


def test_the_extension_has_the_xla_ffi_handlers_and_records_what_it_was_built_against():
    # jaxlib is a build requirement where jax exists (Python >= 3.10, pyproject.toml).
    if sys.version_info < (3, 10):
        assert not seqattn._core.has_xla_ffi
        return
    assert seqattn._core.has_xla_ffi, "seqattn._core was built without the XLA FFI handlers"
    major, minor = seqattn._core.xla_ffi_api_version
    assert isinstance(major, int) and isinstance(minor, int) and (major, minor) >= (0, 1)
    version = seqattn._core.xla_ffi_jaxlib_version
    assert isinstance(version, str) and version[0].isdigit(), version
