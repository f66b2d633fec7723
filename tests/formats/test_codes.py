"""Rounding modes, encodings, optimizer state kinds and Adam's weight decay are numbered once.

The numbers live on the members (:attr:`fpsim.formats.RoundMode.code`,
:attr:`fpsim.formats.Encoding.code`) and in :mod:`fpsim.formats.codes` (``StateKind``,
``Decay``). Checked here: the numbering itself (one number per member, and the numbers never
change, since numba caches loops with them frozen in); the numpy tier and the compiled (numba)
tier take their integers from it, member by member; and no other module of ``fpsim/`` or
``fpsim/kernels/`` numbers these choices again (an AST scan for an enum, a ``range``, a literal
table or a literal comparison doing it, with tests showing the scan finds each pattern). The
Triton tier's constants are compared in tests/kernels/test_kernel_codes.py.
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path

import pytest

from fpsim.emulate import element
from fpsim.formats import FORMATS, Encoding, Format, RoundMode
from fpsim.formats.codes import Decay, StateKind
from fpsim.formats.params import FormatParams
from fpsim.replay.optim import Adam, AdamW

ROOT = Path(__file__).resolve().parents[2]
SHARED: tuple[type[enum.Enum], ...] = (RoundMode, Encoding, StateKind, Decay)
HOMES = {  # the one place each enum is numbered
    RoundMode: "fpsim/formats/rounding.py",
    Encoding: "fpsim/formats/element.py",
    StateKind: "fpsim/formats/codes.py",
    Decay: "fpsim/formats/codes.py",
}
# arguments and constexprs that hold one of these codes (a literal compared with one is a numbering)
CODE_NAMES = {"mode", "enc", "decay", "MODE", "PMODE", "QMODE", "P_MODE", "ENC", "D_ENC", "M_ENC", "V_ENC"}
CODE_NAMES |= {"DECAY", "KIND", "M_KIND", "V_KIND"}


def code(member: enum.Enum) -> int:
    return member.code if isinstance(member, (RoundMode, Encoding)) else int(member)


# The numbers as the compiled loops cached on disk know them: a change here is a renumbering,
# which stale numba caches would not see (fpsim.formats.codes). A new member adds a line.
FIXED = {
    RoundMode: dict(NEAREST_EVEN=0, NEAREST_AWAY=1, TOWARD_ZERO=2, TOWARD_POSITIVE=3, TOWARD_NEGATIVE=4),
    Encoding: dict(IEEE=0, FN=1, FNUZ=2, FINITE=3),
    StateKind: dict(FP32=0, CODEBOOK=1, INT=2, FLOAT=3, INT8_ABSMAX=4, E4M3_ABSMAX=5, TE=6, TE_POW2=7),
    Decay: dict(NONE=0, DECOUPLED=1, L2=2),
}
FIXED[RoundMode].update(STOCHASTIC=5, ODD=6)
FIXED[StateKind].update(QMAP=8, CODEBOOK_LUT=9)


@pytest.mark.parametrize("kind", SHARED, ids=lambda k: k.__name__)
def test_one_number_per_member_fixed_for_good(kind):
    codes = {name: code(m) for name, m in kind.__members__.items()}  # aliases included
    assert all(type(c) is int and c >= 0 for c in codes.values()), codes
    assert len(set(codes.values())) == len(codes), f"{kind.__name__} numbers two members alike: {codes}"
    assert codes == FIXED[kind]


def test_a_member_keeps_its_name_as_value():
    """The number is carried beside the name: parsing, printing and pickling see the name."""
    assert [m.value for m in RoundMode][:2] == ["nearest_even", "nearest_away"]
    assert RoundMode.parse("odd") is RoundMode.ODD and Encoding("fnuz") is Encoding.FNUZ
    with pytest.raises(ValueError, match="allowed: nearest_even"):
        RoundMode.parse(6)


def test_the_numpy_tier_passes_the_encoding_code():
    """The element parameters of the compiled loops carry ``fmt.encoding.code`` in the field
    ``enc`` of :class:`FormatParams` (measure.P_ENC below)."""
    fmts = [f for f in FORMATS.values() if isinstance(f, Format)]
    assert {f.encoding for f in fmts} == set(Encoding)
    for f in fmts:
        assert FormatParams(*element.loop_params(f, False, False)).enc == f.encoding.code, f.name


def test_the_optimizer_decay_mode_is_the_shared_code():
    """:meth:`Adam.scalars` gives the numpy step and the compiled loop :class:`Decay` codes."""
    got = {
        Decay.NONE: Adam(weight_decay=0.0).scalars(1e-3, 1).mode,
        Decay.L2: Adam(weight_decay=0.1).scalars(1e-3, 1).mode,
        Decay.DECOUPLED: AdamW(weight_decay=0.1).scalars(1e-3, 1).mode,
    }
    assert all(type(v) is int and v == int(k) for k, v in got.items()), got
    assert Decay.of(0.0, True) is Decay.NONE and Decay.of(0.5, False) is Decay.L2


def _tier_constants(module, members) -> dict[str, tuple[int, int]]:
    """(module's value, shared code) of each member with a constant ``NAME`` or ``_NAME`` in ``module``."""
    out = {}
    for m in members:
        for name in (m.name, "_" + m.name):
            if hasattr(module, name):
                out[name] = (getattr(module, name), code(m))
    return out


def test_the_compiled_tier_reads_the_shared_numbers():
    pytest.importorskip("numba")
    from fpsim._compiled import loops, measure

    modes = _tier_constants(measure, RoundMode)
    encodings = _tier_constants(measure, Encoding)
    assert len(modes) == len(RoundMode) and len(encodings) == len(Encoding)  # every member
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn"):
        p, fmt = element.loop_params(FORMATS[name], False, False), FORMATS[name]
        assert p[measure.P_ENC] == FormatParams(*p).enc == fmt.encoding.code, name  # named, not numbered
        assert p[measure.P_MAX] == fmt.code_of_max and p[measure.P_EMIN] == fmt.min_exponent, name
    kinds = _tier_constants(loops, StateKind)
    decays = _tier_constants(loops, Decay)
    assert set(kinds) >= {"_CODEBOOK", "_INT8_ABSMAX", "_E4M3_ABSMAX", "_TE_POW2", "_QMAP", "_CODEBOOK_LUT"}
    assert set(decays) == {"_DECOUPLED", "_L2"}
    for name, (got, want) in {**modes, **encodings, **kinds, **decays}.items():
        assert type(got) is int and got == want, name


# --- no second numbering in the source -------------------------------------------------------------

NAMES = {kind: {m for m in kind.__members__} for kind in SHARED}


def _is_int(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _literal_int(node: ast.expr) -> bool:
    """An int literal, possibly wrapped once (``tl.constexpr(3)``, ``int(3)``)."""
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    return _is_int(node)


def _literal_choice(node: ast.expr) -> bool:
    """An int literal or a conditional choosing between int literals (``0 if a else 1``)."""
    if isinstance(node, ast.IfExp):
        return _literal_choice(node.body) and _literal_choice(node.orelse)
    return _is_int(node)


def _shared_name(name: str) -> bool:
    return any(name.lstrip("_") in names for names in NAMES.values())


def numberings(source: str, path: str) -> list[str]:
    """Places in ``source`` that number a shared choice: an enum class most of whose members
    are a shared enum's members, a member's name bound to an int literal or to ``range``, a
    literal table keyed by members, a code argument set to or compared with an int literal."""
    found, tree = [], ast.parse(source, path)
    in_class = {id(s) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for s in c.body}
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ClassDef):
            members = {
                t.id
                for s in node.body
                if isinstance(s, ast.Assign)
                for t in s.targets
                if isinstance(t, ast.Name)
            }
            for kind, names in NAMES.items():
                if (
                    HOMES[kind] != path
                    and members
                    and len(members & names) * 2 > min(len(members), len(names))
                ):
                    found.append(f"{where} class {node.name} numbers {kind.__name__}")
        elif isinstance(node, ast.Assign) and id(node) not in in_class:  # (classes: above)
            for t in node.targets:
                names = [t] if isinstance(t, ast.Name) else list(t.elts) if isinstance(t, ast.Tuple) else []
                shared = [n.id for n in names if isinstance(n, ast.Name) and _shared_name(n.id)]
                is_range = isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "range"
                literal = _literal_int(node.value) or (
                    isinstance(node.value, ast.Tuple) and all(_is_int(e) for e in node.value.elts)
                )
                if shared and (is_range or literal):
                    found.append(f"{where} {', '.join(shared)} numbered by a literal")
                if isinstance(t, ast.Name) and t.id in CODE_NAMES and _literal_choice(node.value):
                    found.append(f"{where} {t.id} chosen among int literals")
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name)]
            if any(k.value.id in {kind.__name__ for kind in SHARED} for k in keys) and any(
                _is_int(v) for v in node.values
            ):
                found.append(f"{where} a table of members to int literals")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [s for s in sides if (getattr(s, "id", None) or getattr(s, "attr", None)) in CODE_NAMES]
            if named and any(_is_int(s) for s in sides):
                found.append(f"{where} a code compared with an int literal")
    return found


def _sources() -> list[Path]:
    return sorted((ROOT / "fpsim").rglob("*.py"))


def test_no_module_numbers_a_shared_choice_again():
    files = _sources()
    assert len(files) > 100 and all(p.is_file() for p in HOMES.values() for p in [ROOT / p])
    bad = [hit for p in files for hit in numberings(p.read_text(), str(p.relative_to(ROOT)))]
    assert not bad, bad


@pytest.mark.parametrize(
    "source",
    [
        "NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO = range(3)",
        "IEEE, FN, FNUZ, FINITE = range(4)",
        "_CODEBOOK = 0",
        "_L2 = tl.constexpr(2)",
        "_ENC = {Encoding.IEEE: 0, Encoding.FN: 1}",
        "class Round(enum.IntEnum):\n    NEAREST_EVEN = 0\n    NEAREST_AWAY = 1\n    ODD = 6",
        "class StateKind(enum.IntEnum):\n    FP32 = 0\n    CODEBOOK = 1\n    INT = 2\n    FLOAT = 3",
        "class Decay(enum.IntEnum):\n    NONE = 0\n    DECOUPLED = 1\n    L2 = 2",
        "def f(mode):\n    if mode == 1:\n        pass",
        "def f(sc):\n    return sc.mode == 2",
        "x = 0 if not wd else 1 if DECAY == 2 else 3",
        "mode = 0 if not wd else 1 if decoupled else 2",
    ],
)
def test_the_scan_finds_a_second_numbering(source):
    assert numberings(source, "fpsim/somewhere.py")


def test_the_scan_passes_derived_codes():
    ok = "NEAREST_EVEN = RoundMode.NEAREST_EVEN.code\n_L2 = int(Decay.L2)\n_X = tl.constexpr(Rule.TE)\n"
    ok += "class Comp(enum.IntEnum):\n    NONE = 0\n    KAHAN = 1\n    NEUMAIER = 2\n"
    ok += "class Rule(enum.IntEnum):\n    TE = 0\n    ABSMAX = 1\n    MX_FLOOR = 2\n    CODEBOOK = 7\n"
    assert numberings(ok, "fpsim/somewhere.py") == []
