"""Every ```python block of README.md runs as written.

The blocks run in order in one namespace, as a reader pasting them into one session would: a block may use
what an earlier one defined (the second uses the first's imports), nothing else is provided. A traceback
names README.md and the line of the failing statement.
"""

import linecache
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(?:python|py)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def python_blocks():
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in FENCE.finditer(text)]


def test_readme_has_python_blocks():
    # A renamed fence must not turn the next test into a test of nothing.
    assert len(python_blocks()) >= 2


def test_readme_python_blocks_run_as_written():
    namespace = {"__name__": "__readme__"}
    for line, block in python_blocks():
        # Padding with newlines makes the traceback's line numbers those of README.md. Each block is its own
        # "file" whose source linecache holds: tools that read the source of a function (inspect.getsource,
        # torch.compile's tracer, which tokenizes the whole file) see this block as Python, not the Markdown.
        source = "\n" * line + block
        name = f"{README} (python block at line {line + 1})"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        exec(compile(source, name, "exec"), namespace)
