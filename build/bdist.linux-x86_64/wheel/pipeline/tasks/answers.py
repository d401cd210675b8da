"""Answer extraction and normalisation for the exact-answer tasks (GSM8K, MATH-500, open QA)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Optional

# thousands-grouped numbers first so "1,234" is one number but "2, 3" stays two
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")
_ANSWER_MARKER = re.compile(r"####|(?:final\s+)?answer\s*(?:is|:)", re.IGNORECASE)


def _clean_number(s: str) -> str:
    return s.replace(",", "").replace("$", "").rstrip(".")


def parse_number(s: str) -> Optional[float]:
    """A plain number (commas allowed), `a/b`, or `\\frac{a}{b}`; None for anything else."""
    s = s.replace(",", "").strip()
    frac = re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}|(-?)([\d.]+)/([\d.]+)", s)
    try:
        if frac:
            sign, num, den = frac.group(1, 2, 3) if frac.group(2) else frac.group(4, 5, 6)
            value = float(num) / float(den)
            return -value if sign else value
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces balanced), or the token
    after `\\boxed ` in the brace-less form; None if absent or cut off."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    command = "\\boxed" if text.startswith("\\boxed", start) else "\\fbox"
    rest = text[start + len(command) :]
    if not rest.startswith("{"):
        token = re.match(r"\s+([^\s$]+)", rest)
        return token.group(1) if token else None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None


def extract_gsm8k_answer(text: str) -> Optional[str]:
    """The model's final number: after the last '####' / 'The answer is', else in the last
    \\boxed{}, else the last number in the text."""
    markers = list(_ANSWER_MARKER.finditer(text))
    hashes = [m for m in markers if m.group(0) == "####"]
    for marker in (hashes or markers)[-1:]:
        numbers = _NUMBER.findall(text[marker.end() :].replace("$", ""))
        if numbers:
            return _clean_number(numbers[0])
    boxed = last_boxed(text)
    numbers = _NUMBER.findall(boxed or "") or _NUMBER.findall(text)
    return _clean_number(numbers[-1]) if numbers else None


def numbers_equal(a: Optional[str], b: Optional[str]) -> bool:
    x, y = parse_number(a or ""), parse_number(b or "")
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def normalize_math(s: str) -> str:
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\^\{?\\circ\}?", "", s)
    # spacing / sizing commands carry no meaning; the lookahead keeps \leftarrow, \rightarrow
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;: ]|\\%|\$", "", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    lhs_rhs = re.fullmatch(r"[a-zA-Z]=(.+)", s)  # "x=5" -> "5"
    return lhs_rhs.group(1) if lhs_rhs else s


def extract_math_answer(text: str) -> Optional[str]:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def math_equal(pred: Optional[str], ref: str) -> bool:
    if pred is None:
        return False
    p, r = normalize_math(pred), normalize_math(ref)
    return p == r or numbers_equal(p, r)


def normalize_qa(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def qa_f1(pred: str, ref: str) -> float:
    p, r = normalize_qa(pred).split(), normalize_qa(ref).split()
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)
