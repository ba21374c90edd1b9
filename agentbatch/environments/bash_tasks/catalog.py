"""The shipped repository-fixing tasks: each a tiny repo with one bug and a failing unittest.

Stdlib only, so `.ci/setup_docker.sh` can run this file with the system python3 to export the repos
into the sandbox image (`python3 catalog.py export DIR`). Each task has:
  id, prompt (the user's request), files (path -> content of the repo), test (shell command run in
  the repo; exit 0 means solved), ground_truth (turns, each a list of bash commands, that solve it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

TEST_CMD = "python3 -m unittest -q 2>&1"

_BASE_PROMPT = (
    "The repository in the current directory has a failing test. Find the bug and fix it so that "
    "`python3 -m unittest` passes. Do not change the tests. "
)

TASKS: list[dict[str, Any]] = [
    {
        "id": "last-n",
        "hint": "`last_n(xs, n)` should return the last n items.",
        "files": {
            "seq.py": "def last_n(xs, n):\n    if n <= 0:\n        return []\n    return xs[-n - 1:]\n",
            "test_seq.py": (
                "import unittest\nfrom seq import last_n\n\n\nclass T(unittest.TestCase):\n"
                "    def test_last_two(self):\n        self.assertEqual(last_n([1, 2, 3, 4], 2), [3, 4])\n\n"
                "    def test_zero(self):\n        self.assertEqual(last_n([1, 2], 0), [])\n"
            ),
        },
        "ground_truth": [
            ["cat seq.py", "python3 -m unittest -q 2>&1 | tail -n 5"],
            ["sed -i 's/xs\\[-n - 1:\\]/xs[-n:]/' seq.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "is-even",
        "hint": "`is_even` gives the wrong answer.",
        "files": {
            "parity.py": "def is_even(n):\n    return n % 2 == 1\n",
            "test_parity.py": (
                "import unittest\nfrom parity import is_even\n\n\nclass T(unittest.TestCase):\n"
                "    def test_even(self):\n        self.assertTrue(is_even(4))\n        self.assertFalse(is_even(7))\n"
            ),
        },
        "ground_truth": [
            ["cat parity.py"],
            ["sed -i 's/n % 2 == 1/n % 2 == 0/' parity.py", "python3 -m unittest -q"],
        ],
    },
    {
        "id": "reverse-words",
        "hint": "`reverse_words` should reverse the order of the words.",
        "files": {
            "text.py": "def reverse_words(s):\n    return ' '.join(s.split()[::1])\n",
            "test_text.py": (
                "import unittest\nfrom text import reverse_words\n\n\nclass T(unittest.TestCase):\n"
                "    def test_reverse(self):\n        self.assertEqual(reverse_words('a b  c'), 'c b a')\n"
            ),
        },
        "ground_truth": [
            ["grep -n split text.py"],
            ["sed -i 's/\\[::1\\]/[::-1]/' text.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "fizzbuzz",
        "hint": "`fizzbuzz(15)` is wrong.",
        "files": {
            "fb.py": (
                "def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n"
                "        return 'Buzz'\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n"
            ),
            "test_fb.py": (
                "import unittest\nfrom fb import fizzbuzz\n\n\nclass T(unittest.TestCase):\n"
                "    def test_values(self):\n"
                "        self.assertEqual([fizzbuzz(i) for i in (1, 3, 5, 15, 30)],"
                " ['1', 'Fizz', 'Buzz', 'FizzBuzz', 'FizzBuzz'])\n"
            ),
        },
        "ground_truth": [
            ["cat fb.py"],
            [
                "cat > fb.py <<'EOF'\ndef fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n"
                "    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
                "    return str(n)\nEOF",
                "python3 -m unittest -q",
            ],
        ],
    },
    {
        "id": "mean-empty",
        "hint": "`mean([])` should be 0.0.",
        "files": {
            "stats.py": "def mean(xs):\n    return sum(xs) / len(xs)\n",
            "test_stats.py": (
                "import unittest\nfrom stats import mean\n\n\nclass T(unittest.TestCase):\n"
                "    def test_mean(self):\n        self.assertEqual(mean([1, 2, 3]), 2)\n\n"
                "    def test_empty(self):\n        self.assertEqual(mean([]), 0.0)\n"
            ),
        },
        "ground_truth": [
            ["python3 -m unittest -q 2>&1 | grep -i error"],
            ["sed -i 's|return sum(xs) / len(xs)|return sum(xs) / len(xs) if xs else 0.0|' stats.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "fahrenheit",
        "hint": "Temperature conversion is off.",
        "files": {
            "temp.py": "def c_to_f(c):\n    return c * 9 / 5 - 32\n",
            "test_temp.py": (
                "import unittest\nfrom temp import c_to_f\n\n\nclass T(unittest.TestCase):\n"
                "    def test_points(self):\n        self.assertEqual(c_to_f(0), 32)\n"
                "        self.assertEqual(c_to_f(100), 212)\n"
            ),
        },
        "ground_truth": [["cat temp.py", "sed -i 's/- 32/+ 32/' temp.py"], ["python3 -m unittest -q"]],
    },
    {
        "id": "word-count",
        "hint": "Word counting should ignore case.",
        "files": {
            "wc.py": (
                "from collections import Counter\n\n\ndef word_counts(text):\n"
                "    return dict(Counter(text.split()))\n"
            ),
            "test_wc.py": (
                "import unittest\nfrom wc import word_counts\n\n\nclass T(unittest.TestCase):\n"
                "    def test_case(self):\n"
                "        self.assertEqual(word_counts('The cat the Cat'), {'the': 2, 'cat': 2})\n"
            ),
        },
        "ground_truth": [
            ["cat wc.py"],
            ["sed -i 's/text.split()/text.lower().split()/' wc.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "palindrome",
        "hint": "`is_palindrome` should ignore case and anything but letters and digits.",
        "files": {
            "pal.py": "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n",
            "test_pal.py": (
                "import unittest\nfrom pal import is_palindrome\n\n\nclass T(unittest.TestCase):\n"
                "    def test_phrase(self):\n"
                "        self.assertTrue(is_palindrome('A man, a plan, a canal: Panama'))\n"
                "        self.assertFalse(is_palindrome('abc'))\n"
            ),
        },
        "ground_truth": [
            ["cat pal.py"],
            ["sed -i \"s/t = s.lower()/t = ''.join(ch for ch in s.lower() if ch.isalnum())/\" pal.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "factorial",
        "hint": "`factorial(0)` never returns.",
        "files": {
            "fact.py": "def factorial(n):\n    if n == 1:\n        return 1\n    return n * factorial(n - 1)\n",
            "test_fact.py": (
                "import unittest\nfrom fact import factorial\n\n\nclass T(unittest.TestCase):\n"
                "    def test_small(self):\n        self.assertEqual(factorial(5), 120)\n"
                "        self.assertEqual(factorial(0), 1)\n"
            ),
        },
        "ground_truth": [
            ["cat fact.py"],
            ["sed -i 's/if n == 1:/if n <= 1:/' fact.py", "python3 -m unittest -q"],
        ],
    },
    {
        "id": "merge-dicts",
        "hint": "`merge` must not modify its arguments.",
        "files": {
            "merge.py": "def merge(a, b):\n    a.update(b)\n    return a\n",
            "test_merge.py": (
                "import unittest\nfrom merge import merge\n\n\nclass T(unittest.TestCase):\n"
                "    def test_pure(self):\n        a = {'x': 1}\n        out = merge(a, {'y': 2})\n"
                "        self.assertEqual(out, {'x': 1, 'y': 2})\n        self.assertEqual(a, {'x': 1})\n"
            ),
        },
        "ground_truth": [
            ["cat merge.py"],
            [
                "printf 'def merge(a, b):\\n    out = dict(a)\\n    out.update(b)\\n    return out\\n' > merge.py",
                "python3 -m unittest -q",
            ],
        ],
    },
    {
        "id": "config-parse",
        "hint": "Values read from the config keep surrounding spaces.",
        "files": {
            "conf.py": (
                "def parse(text):\n    out = {}\n    for line in text.splitlines():\n"
                "        if not line.strip() or line.startswith('#'):\n            continue\n"
                "        key, _, value = line.partition('=')\n        out[key] = value\n    return out\n"
            ),
            "test_conf.py": (
                "import unittest\nfrom conf import parse\n\n\nclass T(unittest.TestCase):\n"
                "    def test_spaces(self):\n"
                "        self.assertEqual(parse('a = 1\\n# c\\nname =  x y \\n'), {'a': '1', 'name': 'x y'})\n"
            ),
        },
        "ground_truth": [
            ["cat conf.py", "python3 -m unittest -q 2>&1 | tail -n 3"],
            ["sed -i 's/out\\[key\\] = value/out[key.strip()] = value.strip()/' conf.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "binary-search",
        "hint": "`find` misses some items that are present.",
        "files": {
            "bsearch.py": (
                "def find(xs, x):\n    lo, hi = 0, len(xs)\n    while lo < hi:\n        mid = (lo + hi) // 2\n"
                "        if xs[mid] < x:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n"
                "    return lo if lo < len(xs) and xs[lo] == x else -1\n"
            ),
            "test_bsearch.py": (
                "import unittest\nfrom bsearch import find\n\n\nclass T(unittest.TestCase):\n"
                "    def test_all(self):\n        xs = [1, 3, 5, 7, 9, 11]\n"
                "        for i, x in enumerate(xs):\n            self.assertEqual(find(xs, x), i)\n"
                "        self.assertEqual(find(xs, 4), -1)\n"
            ),
        },
        "ground_truth": [
            ["cat bsearch.py"],
            ["sed -i 's/hi = mid - 1/hi = mid/' bsearch.py"],
            ["python3 -m unittest -q"],
        ],
    },
    {
        "id": "slugify-missing",
        "hint": "The module `slug` that the test imports does not exist yet; `slugify` lowercases and "
        "joins the words with dashes.",
        "files": {
            "test_slug.py": (
                "import unittest\nfrom slug import slugify\n\n\nclass T(unittest.TestCase):\n"
                "    def test_slug(self):\n        self.assertEqual(slugify('  Hello   World '), 'hello-world')\n"
            ),
        },
        "ground_truth": [
            ["ls -la", "cat test_slug.py"],
            [
                "cat > slug.py <<'EOF'\ndef slugify(s):\n    return '-'.join(s.lower().split())\nEOF",
                "python3 -m unittest -q",
            ],
        ],
    },
    {
        "id": "clamp-args",
        "hint": "`clamp` swaps its bounds.",
        "files": {
            "clamp.py": "def clamp(x, lo, hi):\n    return max(hi, min(lo, x))\n",
            "test_clamp.py": (
                "import unittest\nfrom clamp import clamp\n\n\nclass T(unittest.TestCase):\n"
                "    def test_clamp(self):\n        self.assertEqual(clamp(5, 0, 3), 3)\n"
                "        self.assertEqual(clamp(-1, 0, 3), 0)\n        self.assertEqual(clamp(2, 0, 3), 2)\n"
            ),
        },
        "ground_truth": [
            ["cat clamp.py"],
            ["sed -i 's/max(hi, min(lo, x))/max(lo, min(hi, x))/' clamp.py"],
            ["python3 -m unittest -q"],
        ],
    },
]


def prompt_of(task: dict[str, Any]) -> str:
    return _BASE_PROMPT + task["hint"]


def by_id() -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in TASKS}


def export(dest: Path) -> None:
    """Write each task's repo to dest/<id>/ (the sandbox image ships them under /opt/agentbatch/tasks)."""
    for task in TASKS:
        for rel, content in task["files"].items():
            path = dest / task["id"] / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(Path(sys.argv[2]))
    else:
        print("usage: catalog.py export DIR", file=sys.stderr)
        sys.exit(2)
