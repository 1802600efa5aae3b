#!/usr/bin/env python3
"""No test that cannot fail: every TEST / TEST_F / TEST_P body in tests/**/test_*.cpp must contain
a gtest assertion (EXPECT_*, ASSERT_*, FAIL(), ADD_FAILURE(), GTEST_SKIP is not one) or call a
helper, defined in the tests, whose body does. Prints each test that asserts nothing; exit 1 if any.
"""
import pathlib
import re
import sys

ASSERT = re.compile(r"\b(EXPECT_[A-Z_]+|ASSERT_[A-Z_]+|FAIL\s*\(\s*\)|ADD_FAILURE\s*\()")
TEST_HEAD = re.compile(r"^\s*(TEST|TEST_F|TEST_P)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{", re.M)
FUNC_HEAD = re.compile(r"^[ \t]*[A-Za-z_][\w:<>,\s\*&]*?\b(\w+)\s*\([^;{]*\)\s*(const\s*)?\{", re.M)
MACRO = re.compile(r"^#define\s+(\w+)[^\n]*(?:\\\n[^\n]*)*", re.M)


def body_at(text, open_brace):
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace:i + 1]
    return text[open_brace:]


def asserting_helpers(texts):
    """Names of functions and macros whose definition asserts (iterated: helpers calling helpers)."""
    bodies = {}
    for text in texts:
        for m in FUNC_HEAD.finditer(text):
            if m.group(1) in ("TEST", "TEST_F", "TEST_P", "if", "for", "while", "switch"):
                continue
            bodies.setdefault(m.group(1), []).append(body_at(text, m.end() - 1))
        for m in MACRO.finditer(text):
            bodies.setdefault(m.group(1), []).append(m.group(0))
    good = set()
    changed = True
    while changed:
        changed = False
        for name, bs in bodies.items():
            if name in good or "SKIP" in name:  # a skip helper fails only when data is missing
                continue
            if any(ASSERT.search(b) or any(re.search(r"\b%s\b" % g, b) for g in good) for b in bs):
                good.add(name)
                changed = True
    return good


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve() / "tests"
    sources = sorted(root.rglob("*.cpp")) + sorted(root.rglob("*.h"))
    texts = {p: p.read_text(errors="replace") for p in sources}
    helpers = asserting_helpers(texts.values())
    bad = []
    count = 0
    for path, text in texts.items():
        if not path.name.startswith("test_") or path.suffix != ".cpp":
            continue
        for m in TEST_HEAD.finditer(text):
            count += 1
            body = body_at(text, m.end() - 1)
            if ASSERT.search(body) or any(re.search(r"\b%s\s*(<[^;(){}]*>)?\s*\(" % h, body) for h in helpers):
                continue
            line = text[:m.start()].count("\n") + 1
            bad.append(f"{path.relative_to(root.parent)}:{line}: {m.group(2)}.{m.group(3)} asserts nothing")
    for b in bad:
        print(b)
    print(f"tests_assert: {count} tests, {len(bad)} without an assertion")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
