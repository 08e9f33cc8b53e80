"""Glob matching exactly as docs/reference/policy.md §2 defines it; ``fnmatch`` is not used because its ``*``
crosses ``/``.

Rules of this module:

1. One parser per glob dialect produces *pieces* (a piece is a set of alternative token runs). Both the regular
   expression used for matching and the intersection test used by the ambiguity check (§1.11) are generated
   from those same pieces, so the validator, the matcher and the overlap check can never disagree (§5 bug 1).
2. Dialects:
   * **path** (§2.2, also binary globs §2.3): ``*`` and ``?`` never match ``/``; ``[...]``/``[!...]`` classes
     (which never match ``/`` either); ``{a,b}`` alternation; ``\\`` escapes. ``**`` is special only as a whole
     segment: pattern ``**`` matches everything, leading ``**/`` matches zero or more leading segments,
     trailing ``/**`` matches ``/`` plus anything (so ``/x/**`` does not match ``/x``), infix ``/**/`` matches
     ``/`` or ``/…/``; anywhere else ``**`` is ``*``.
   * **value** (§2.4 with decision D4): delimiter-free; ``*`` is any run of characters, ``?`` any one.
   * **host** (§2.1): lower-case labels; ``**`` (legal only as the entire first label) matches one or more whole
     labels; any other label pattern matches exactly one label, ``*`` and ``?`` staying within it.
3. Unbalanced ``[`` or ``{`` is a syntax error (upstream warns, then errors at evaluation time, i.e. denies).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Dialect = Literal["path", "value", "label"]

GLOB_CHARS = frozenset("*?[{")
MAX_ALTERNATIVES = 64  # brace expansion bound for the overlap check; beyond it we assume overlap
MAX_CLASS_RANGE = 4096


class GlobSyntaxError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CharSet:
    """A set of characters: ``chars`` itself, or everything except ``chars`` when ``negated``."""

    negated: bool
    chars: frozenset[str]

    def has_common(self, other: CharSet) -> bool:
        if self.negated and other.negated:
            return True  # the alphabet is infinite for our purpose
        if self.negated:
            return bool(other.chars - self.chars)
        if other.negated:
            return bool(self.chars - other.chars)
        return bool(self.chars & other.chars)

    def regex(self) -> str:
        if not self.negated:
            if len(self.chars) == 1:
                return re.escape(next(iter(self.chars)))
            return "[" + "".join(_class_escape(c) for c in sorted(self.chars)) + "]"
        if not self.chars:
            return "."
        return "[^" + "".join(_class_escape(c) for c in sorted(self.chars)) + "]"


def _class_escape(char: str) -> str:
    return "\\" + char if char in "\\]^-[" else char


ANY = CharSet(True, frozenset())
NOT_SLASH = CharSet(True, frozenset("/"))
NOT_DOT = CharSet(True, frozenset("."))


@functools.lru_cache(maxsize=1024)
def _lit(char: str) -> CharSet:
    return CharSet(False, frozenset(char))


@functools.lru_cache(maxsize=1024)
def _lit_piece(char: str) -> Piece:
    return ((Tok(False, _lit(char)),),)


@dataclass(frozen=True, slots=True)
class Tok:
    star: bool  # zero or more characters from ``cs``; otherwise exactly one
    cs: CharSet

    def regex(self) -> str:
        return self.cs.regex() + ("*" if self.star else "")


Run = tuple[Tok, ...]
Piece = tuple[Run, ...]  # alternatives


def has_glob_chars(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


# --- parsing ---------------------------------------------------------------------------------------------


def _star_set(dialect: Dialect) -> CharSet:
    return {"path": NOT_SLASH, "value": ANY, "label": NOT_DOT}[dialect]


def _parse_class(pattern: str, start: int, dialect: Dialect) -> tuple[CharSet, int]:
    """Parse ``[...]`` starting at ``pattern[start] == '['``; return the set and the index after ``]``."""
    i = start + 1
    negated = False
    if i < len(pattern) and pattern[i] in "!^":
        negated = True
        i += 1
    chars: set[str] = set()
    first = True
    while True:
        if i >= len(pattern):
            raise GlobSyntaxError(f"unbalanced '[' at offset {start}")
        c = pattern[i]
        if c == "]" and not first:
            i += 1
            break
        first = False
        if c == "\\" and i + 1 < len(pattern):
            c = pattern[i + 1]
            i += 1
        if i + 2 < len(pattern) and pattern[i + 1] == "-" and pattern[i + 2] != "]":
            hi = pattern[i + 2]
            if hi == "\\" and i + 3 < len(pattern):
                hi = pattern[i + 3]
                i += 1
            if ord(hi) < ord(c):
                raise GlobSyntaxError(f"reversed range '{c}-{hi}' in class")
            if ord(hi) - ord(c) > MAX_CLASS_RANGE:
                raise GlobSyntaxError(f"class range '{c}-{hi}' is too large")
            chars.update(chr(o) for o in range(ord(c), ord(hi) + 1))
            i += 3
        else:
            chars.add(c)
            i += 1
    separator = {"path": "/", "label": ".", "value": ""}[dialect]
    if separator:
        if negated:
            chars.add(separator)
        else:
            chars.discard(separator)
            if not chars:
                raise GlobSyntaxError(f"class at offset {start} can only match the separator {separator!r}")
    return CharSet(negated, frozenset(chars)), i


def _find_brace_end(pattern: str, start: int) -> tuple[int, list[str]]:
    """Split ``{a,b}`` at ``pattern[start] == '{'`` into its alternatives; return (index after ``}``, alts)."""
    alts: list[str] = []
    current: list[str] = []
    i = start + 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            current.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                raise GlobSyntaxError(f"unbalanced '[' at offset {i}")
            current.append(pattern[i : end + 1])
            i = end + 1
            continue
        if c == "{":
            raise GlobSyntaxError(f"nested '{{' at offset {i}")
        if c == ",":
            alts.append("".join(current))
            current = []
            i += 1
            continue
        if c == "}":
            alts.append("".join(current))
            return i + 1, alts
        current.append(c)
        i += 1
    raise GlobSyntaxError(f"unbalanced '{{' at offset {start}")


def _parse_simple(pattern: str, dialect: Dialect, *, braces: bool) -> list[Piece]:
    """Parse without whole-segment ``**`` handling (that is done by :func:`parse_path`)."""
    pieces: list[Piece] = []
    star = _star_set(dialect)
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            while i < len(pattern) and pattern[i] == "*":
                i += 1
            pieces.append(((Tok(True, star),),))
            continue
        if c == "?":
            pieces.append(((Tok(False, star),),))
        elif c == "[":
            cs, i = _parse_class(pattern, i, dialect)
            pieces.append(((Tok(False, cs),),))
            continue
        elif c == "{" and braces:
            i, alts = _find_brace_end(pattern, i)
            runs: list[Run] = []
            for alt in alts:
                runs.extend(_expand(_parse_simple(alt, dialect, braces=False)))
            pieces.append(tuple(runs))
            continue
        elif c == "\\":
            if i + 1 >= len(pattern):
                raise GlobSyntaxError("trailing backslash")
            pieces.append(_lit_piece(pattern[i + 1]))
            i += 2
            continue
        else:
            pieces.append(_lit_piece(c))
        i += 1
    return pieces


def _literal_run(text: str) -> Run:
    return tuple(Tok(False, _lit(c)) for c in text)


def parse_path(pattern: str) -> list[Piece]:
    """Pieces of a §2.2 path glob, with the whole-segment ``**`` forms."""
    if pattern == "**":
        return [((Tok(True, ANY),),)]
    pieces: list[Piece] = []
    rest = pattern
    if rest.startswith("**/"):
        # leading '**/' = zero or more leading segments: '', '/', or anything ending in '/'
        pieces.append(((), _literal_run("/"), (Tok(True, ANY), Tok(False, _lit("/")))))
        rest = rest[3:]
    # split the remainder at the whole-segment '/**' forms, parse the parts in between simply
    parts = re.split(r"(/\*\*(?=/|$))", rest)
    i = 0
    while i < len(parts):
        part = parts[i]
        if part == "/**":
            at_end = i + 1 >= len(parts) or (parts[i + 1] == "" and i + 2 >= len(parts))
            if at_end:
                pieces.append(((Tok(False, _lit("/")), Tok(True, ANY)),))
            else:
                # infix '/**/' = '/' or '/…/'; the following part starts with that second '/'
                nxt = parts[i + 1]
                pieces.append((_literal_run("/"), (Tok(False, _lit("/")), Tok(True, ANY), Tok(False, _lit("/")))))
                parts[i + 1] = nxt[1:]
        elif part:
            pieces.extend(_parse_simple(part, "path", braces=True))
        i += 1
    return pieces


def _expand(pieces: Sequence[Piece], limit: int = MAX_ALTERNATIVES) -> list[Run]:
    count = 1
    for piece in pieces:
        count *= max(len(piece), 1)
        if count > limit:
            raise OverflowError
    return [tuple(itertools.chain.from_iterable(combo)) for combo in itertools.product(*pieces)]


def pieces_regex(pieces: Iterable[Piece]) -> str:
    out: list[str] = []
    for piece in pieces:
        if len(piece) == 1 and len(piece[0]) == 1:
            out.append(_tok_regex(piece[0][0]))
        elif len(piece) == 1:
            out.append("".join(t.regex() for t in piece[0]))
        else:
            out.append("(?:" + "|".join("".join(t.regex() for t in run) for run in piece) + ")")
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _tok_regex(tok: Tok) -> str:
    return tok.regex()


# --- compiled matchers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Glob:
    """A compiled path or value glob; ``literal`` globs are compared by equality."""

    pattern: str
    pieces: tuple[Piece, ...]
    regex: re.Pattern[str] | None

    def matches(self, text: str) -> bool:
        if self.regex is None:
            return text == self.pattern
        return self.regex.fullmatch(text) is not None


@functools.lru_cache(maxsize=8192)
def compile_path_glob(pattern: str) -> Glob:
    pieces = tuple(parse_path(pattern))
    literal = not has_glob_chars(pattern) and "\\" not in pattern
    return Glob(pattern, pieces, None if literal else re.compile(pieces_regex(pieces), re.S))


@functools.lru_cache(maxsize=8192)
def compile_value_glob(pattern: str) -> Glob:
    pieces = tuple(_parse_simple(pattern, "value", braces=True))
    literal = not has_glob_chars(pattern) and "\\" not in pattern
    return Glob(pattern, pieces, None if literal else re.compile(pieces_regex(pieces), re.S))


def runs_intersect(a: Run, b: Run) -> bool:
    """Whether two token runs can match a common string (product automaton reachability)."""
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        ta = a[i] if i < len(a) else None
        tb = b[j] if j < len(b) else None
        if ta is not None and ta.star:
            stack.append((i + 1, j))
            if tb is not None and not tb.star and ta.cs.has_common(tb.cs):
                stack.append((i, j + 1))
        if tb is not None and tb.star:
            stack.append((i, j + 1))
            if ta is not None and not ta.star and tb.cs.has_common(ta.cs):
                stack.append((i + 1, j))
        if ta is not None and tb is not None and not ta.star and not tb.star and ta.cs.has_common(tb.cs):
            stack.append((i + 1, j + 1))
    return False


def globs_intersect(a: Sequence[Piece], b: Sequence[Piece]) -> bool:
    try:
        runs_a, runs_b = _expand(a), _expand(b)
    except OverflowError:
        return True  # too many alternatives to prove disjointness: assume they overlap
    return any(runs_intersect(x, y) for x in runs_a for y in runs_b)


def path_globs_intersect(a: str, b: str) -> bool:
    return globs_intersect(parse_path(a), parse_path(b))


# --- hosts -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostGlob:
    """A §2.1 host glob. ``labels`` is the exact label count, or the minimum when ``recursive`` (``**.``)."""

    pattern: str
    regex: re.Pattern[str]
    labels: int
    recursive: bool
    literal_suffix: tuple[str, ...]  # trailing labels without glob characters, for the index
    label_pieces: tuple[tuple[Piece, ...], ...]  # per label, excluding a leading '**'
    # every label in front of the literal suffix is a whole '*' (after an optional leading '**'): a host of
    # non-empty, dot-free labels with that suffix and an admissible label count matches without the regex
    suffix_decides: bool = False

    def matches(self, host: str) -> bool:
        return self.regex.fullmatch(host) is not None

    def intersects(self, other: HostGlob) -> bool:
        a, b = self.label_pieces, other.label_pieces
        if not self.recursive and not other.recursive and len(a) != len(b):
            return False
        if self.recursive and not other.recursive and len(b) <= len(a):
            return False
        if other.recursive and not self.recursive and len(a) <= len(b):
            return False
        # align from the last label; a recursive side's '**' absorbs whatever the other has in front
        return all(globs_intersect(x, y) for x, y in zip(reversed(a), reversed(b), strict=False))


def compile_host_glob(pattern: str) -> HostGlob:
    """Compile a lower-cased, already validated host glob (see ``hosts.validate_policy_host``)."""
    labels = pattern.split(".")
    recursive = labels[0] == "**"
    rest = labels[1:] if recursive else labels
    label_pieces: list[tuple[Piece, ...]] = []
    parts: list[str] = []
    for label in rest:
        pieces = tuple(_parse_simple(label, "label", braces=False))
        if label == "*":
            # a whole-label '*' never matches an empty label (candidates have none); say so for the overlap check
            pieces = (((Tok(False, NOT_DOT),),), ((Tok(True, NOT_DOT),),))
        label_pieces.append(pieces)
        parts.append(pieces_regex(pieces))
    body = r"\.".join(parts)
    regex = r"(?:[^.]+\.)+" + body if recursive else body
    suffix: list[str] = []
    for label in reversed(rest):
        if has_glob_chars(label):
            break
        suffix.append(label)
    return HostGlob(
        pattern=pattern,
        regex=re.compile(regex, re.S),
        labels=len(rest) + (1 if recursive else 0),
        recursive=recursive,
        literal_suffix=tuple(reversed(suffix)),
        label_pieces=tuple(label_pieces),
        suffix_decides=all(label == "*" for label in rest[: len(rest) - len(suffix)]),
    )


def host_pattern_matches(pattern: str, host: str) -> bool:
    """Reference predicate of §3.3: exact equality without ``*``, otherwise the host glob."""
    if "*" not in pattern:
        return pattern == host
    return compile_host_glob(pattern).matches(host)
