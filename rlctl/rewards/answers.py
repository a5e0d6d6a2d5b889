"""Answer checking shared by the built-in rewards and plugins: completion text, GSM8K final answers, `\\boxed{}`
contents, and math equality (numbers, normalised LaTeX, small symbolic expressions)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion, plain or conversational (a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def _truths(answer: Any) -> list[str]:
    """A ground truth as the list of acceptable answers (verl data may hold a list)."""
    if isinstance(answer, list | tuple):
        return [str(a) for a in answer]
    return [str(answer)]


_NUMBER = re.compile(r"-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?")


def _to_number(text: str) -> Fraction | float | None:
    """`text` as a number when it is one: 1,234  -3.5  1e-3  3/4  50%  $12 (else None)."""
    t = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    percent = t.endswith("%")
    t = t.rstrip("%")
    try:
        if re.fullmatch(r"-?\d+/\d+", t):
            value: Fraction | float = Fraction(t)
        elif re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", t):
            value = Fraction(t) if "e" not in t.lower() else float(t)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def numbers_equal(a: Fraction | float, b: Fraction | float) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def gsm8k_answer(text: str, strict: bool = True) -> str | None:
    """The final answer of a GSM8K-style solution: the number after `####` (strict), or else the last number
    in the text (flexible)."""
    match = re.findall(r"####\s*\$?\s*(-?[\d,]*\.?\d+)", text)
    if match:
        return match[-1].replace(",", "")
    if strict:
        return None
    numbers = [n for n in _NUMBER.findall(text) if re.search(r"\d", n)]
    return numbers[-1].replace(",", "") if numbers else None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start + len("\\boxed") :].strip()  # \boxed 5
        return rest.split("$")[0].strip() or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _strip_braces(s: str) -> str:
    while s.startswith("{") and s.endswith("}") and last_boxed("\\boxed" + s) == s[1:-1]:
        s = s[1:-1]
    return s


def _frac_to_text(s: str) -> str:
    """`\\frac{a}{b}` (also \\dfrac, \\tfrac, and \\frac12) as `(a)/(b)`, nested ones included."""
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    while "\\frac{" in s:
        i = s.find("\\frac{")
        num = last_boxed("\\boxed" + s[i + 5 :])
        if num is None:
            break
        j = i + 5 + len(num) + 2
        if j >= len(s) or s[j] != "{":
            break
        den = last_boxed("\\boxed" + s[j:])
        if den is None:
            break
        s = s[:i] + f"({num})/({den})" + s[j + len(den) + 2 :]
    return s


def normalize_math(text: str) -> str:
    """A LaTeX or plain math answer in a canonical text form for comparison."""
    s = text.strip().strip("$").strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(mathrm|textbf|mathbf)\{([^{}]*)\}", r"\2", s)
    for unit in ("degrees", "degree", "cm", "units", "unit", "inches", "meters", "dollars"):
        s = re.sub(rf"\s*{unit}$", "", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "^\\circ", "^{\\circ}", "\\%", "\\$"):
        s = s.replace(token, "")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("\\pi", "pi")
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = _frac_to_text(s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # x = 5 -> 5
    s = s.replace(" ", "").rstrip(".")
    s = _strip_braces(s)
    s = re.sub(r"(?<![A-Za-z])\(([\d.]+)\)", r"\1", s)  # (3)/(4) -> 3/4; sqrt(2) stays
    return s


_SAFE_EXPR = re.compile(r"[A-Za-z0-9\s+\-*/^().]+")


def _sympy_equal(a: str, b: str) -> bool:
    """Symbolic equality of two normalised expressions when both are small, safe arithmetic (letters, digits,
    operators, parentheses) that sympy parses; False otherwise. Model outputs are untrusted: no underscores,
    attribute access or huge powers reach the parser."""
    both = a + b
    if not (_SAFE_EXPR.fullmatch(a) and _SAFE_EXPR.fullmatch(b)) or len(a) > 80 or len(b) > 80:
        return False
    if re.search(r"\.(?!\d)", both) or "**" in both or re.search(r"\^\s*\(?\s*\d{3,}", both) or a.count("^") > 1:
        return False
    try:
        from sympy import simplify
        from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations

        rules = (*standard_transformations, implicit_multiplication)
        ea, eb = (parse_expr(x.replace("^", "**"), transformations=rules) for x in (a, b))
        return bool(simplify(ea - eb) == 0)
    except Exception:
        return False


def math_equal(prediction: str, truth: str) -> bool:
    """Whether two math answers are equal: as numbers (1/2 = 0.5 = \\frac{1}{2} = 50%), as normalised text, or
    symbolically (2\\sqrt{2} = \\sqrt{8})."""
    if prediction.strip() == truth.strip():
        return True
    a, b = normalize_math(prediction), normalize_math(truth)
    if a == b:
        return True
    na, nb = _to_number(a), _to_number(b)
    if na is not None and nb is not None:
        return numbers_equal(na, nb)
    if "," in a and "," in b:  # tuples and lists of answers, element-wise
        pa, pb = a.strip("()[]{}").split(","), b.strip("()[]{}").split(",")
        return len(pa) == len(pb) and all(math_equal(x, y) for x, y in zip(pa, pb, strict=True))
    return _sympy_equal(a, b)
