#!/usr/bin/env python3
"""Writes each ```cpp block of README.md as a C++ file to compile, so the README's
snippets stay true to the API.

A block is compiled as written. A block that is not a whole file has an HTML comment
right before it, invisible on the rendered page, that holds the code around it:
    <!-- snippet
    #include <sgpu/sgpu.h>
    int hello_world(std::string name);
    void usage(sgpu::Distributed<int (*)(std::string)>& hello) {
    @snippet
    }
    -->
Usage: ci/readme_snippets.py README.md OUT_DIR; prints the files written.
"""
import os
import re
import sys


def main():
    readme, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    text = open(readme, encoding="utf-8").read()
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
        path = os.path.join(out, f"readme_line_{line}.cc")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"// README.md line {line}\n{code}")
        written.append(path)
    if not written:
        sys.exit(f"{readme}: no ```cpp block")
    print("\n".join(written))


if __name__ == "__main__":
    main()
