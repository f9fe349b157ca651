#!/usr/bin/env python3
"""Writes each ```cpp block of the README and the manual (docs/) as a C++ file to compile,
so their snippets stay true to the API.

A block is compiled as written. A block that is not a whole file has an HTML comment
right before it, invisible on the rendered page, that holds the code around it:
    <!-- snippet
    #include <sgpu/sgpu.h>
    int hello_world(std::string name);
    void usage(sgpu::Distributed<int (*)(std::string)>& hello) {
    @snippet
    }
    -->
Usage: ci/readme_snippets.py FILE.md... OUT_DIR; prints the files written.
"""
import os
import re
import sys


def snippets(readme, out):
    """The files written for one Markdown file's ```cpp blocks."""
    text = open(readme, encoding="utf-8").read()
    stem = os.path.splitext(readme)[0].replace(os.sep, "_").replace("-", "_")
    written = []
    for block in re.finditer(r"^```cpp\n(.*?)^```$", text, re.S | re.M):
        before = text[: block.start()].rstrip()
        code = block.group(1)
        line = text.count("\n", 0, block.start()) + 1
        opening = before.rfind("<!-- snippet\n")
        if before.endswith("-->") and opening >= 0:
            context = before[opening + len("<!-- snippet\n") : -len("-->")]
            if "@snippet\n" not in context:
                sys.exit(f"{readme}:{line}: the snippet comment before this block has no @snippet")
            code = context.replace("@snippet\n", code)
        path = os.path.join(out, f"{stem}_line_{line}.cc")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"// {readme} line {line}\n{code}")
        written.append(path)
    return written


def main():
    *readmes, out = sys.argv[1:]
    if not readmes:
        sys.exit("usage: ci/readme_snippets.py FILE.md... OUT_DIR")
    os.makedirs(out, exist_ok=True)
    written = [path for readme in readmes for path in snippets(readme, out)]
    if not written:
        sys.exit(f"{' '.join(readmes)}: no ```cpp block")
    print("\n".join(written))


if __name__ == "__main__":
    main()
