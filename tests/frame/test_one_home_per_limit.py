"""A limit is defined once, on its schema field: no module outside the schemas gives a limit-like name
(max_*, *_timeout*, *_bytes, *_pixels, nodata*) a number that copies or shadows a schema limit, and no
two modules define the same limit. Found by reading the source (ast), so nothing is imported or run."""
import ast
import dataclasses
import operator
import re
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from appliance.config.schema import AppConfig

PACKAGE = Path(__file__).resolve().parents[2] / "appliance"
# Where limits are declared: the config schemas (and the protocol models, which carry the request rules).
HOMES = ("config/schema.py", "engine/config.py", "protocol/")
LIMIT_NAME = re.compile(r"(^|_)(max_|nodata)|timeout|_bytes$|_pixels$|^(max|bytes|pixels|nodata)$")
CALL_ARGUMENT = "call:"  # marks a keyword argument of a call among the names defined_limits finds
FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift,
        ast.Pow: operator.pow, ast.FloorDiv: operator.floordiv}


class Limit(NamedTuple):
    key: str  # server.limits.max_media_bytes
    name: str  # max_media_bytes
    value: float


class Finding(NamedTuple):
    where: str  # path:line
    name: str
    value: float
    why: str

    def __str__(self) -> str:
        return f"{self.where}: {self.name} = {self.value:g}: {self.why}"


def schema_limits(schema: type = AppConfig, prefix: str = "") -> List[Limit]:
    """Every limit-named numeric field default of `schema` and the dataclasses under it."""
    found = []
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        nested = next((t for t in (field.type, *getattr(field.type, "__args__", ())) if dataclasses.is_dataclass(t)),
                      None)
        if nested is not None:
            found += schema_limits(nested, key + ".")
        elif (LIMIT_NAME.search(field.name) and isinstance(field.default, (int, float))
              and not isinstance(field.default, bool)):
            found.append(Limit(key, field.name, field.default))
    return found


def unit(name: str) -> Optional[str]:
    """What a limit-like name measures, where its name says: two such values agreeing is no coincidence."""
    name = name.lower()
    for word, measure in (("bytes", "bytes"), ("pixels", "pixels"), ("timeout", "seconds")):
        if word in name:
            return measure
    return None


def number(node: ast.AST) -> Optional[float]:
    """The value of a numeric literal or of arithmetic on literals (20 * 1024 * 1024, 16 << 20), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in FOLD:
        left, right = number(node.left), number(node.right)
        return None if left is None or right is None else FOLD[type(node.op)](left, right)
    return None


def defined_limits(source: str) -> List[Tuple[int, str, float]]:
    """(line, name, value) of each limit-like name given a number, in line order: assignments and class
    fields, parameter defaults, and `timeout=` style keyword arguments."""
    return sorted(_defined_limits(source))


def _defined_limits(source: str) -> Iterator[Tuple[int, str, float]]:
    for node in ast.walk(ast.parse(source)):
        pairs: List[Tuple[str, ast.AST]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs = [(node.target.id, node.value)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [(a.arg, d) for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults)]
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        elif isinstance(node, ast.Call):
            # A keyword argument uses a value (`SamplingParams(max_tokens=1)`); it names a limit only when
            # it copies or shadows the schema's, so it is kept apart from the definitions.
            pairs = [(CALL_ARGUMENT + k.arg, k.value) for k in node.keywords if k.arg]
        for name, value_node in pairs:
            value = number(value_node)
            if value is not None and LIMIT_NAME.search(name.lower()):
                yield value_node.lineno, name, value


def scan(files: Dict[str, str], limits: Sequence[Limit]) -> List[Finding]:
    """Findings over {path: source} against the schema's `limits`."""
    findings, seen = [], {}
    for path, source in sorted(files.items()):
        for line, marked, value in defined_limits(source):
            name = marked.removeprefix(CALL_ARGUMENT)
            where, bare = f"{path}:{line}", name.lower().removeprefix("default_")
            same_name = [lim for lim in limits if bare.endswith(lim.name)]
            same_value = [lim for lim in limits if unit(lim.name) and unit(lim.name) == unit(name)
                          and lim.value == value]
            if same_name:
                findings.append(Finding(where, name, value, f"shadows {same_name[0].key} "
                                        f"({same_name[0].value:g}); read that field instead"))
            elif same_value:
                keys = " or ".join(lim.key for lim in same_value)
                findings.append(Finding(where, name, value, f"copies {keys}; read that field instead"))
            elif marked.startswith(CALL_ARGUMENT):
                continue
            elif name in seen and seen[name][0] != path:
                findings.append(Finding(where, name, value, f"also defined at {seen[name][1]}; "
                                        "give it one home (a schema field, or one module's constant)"))
            else:
                seen.setdefault(name, (path, where))
    return findings


def package_sources() -> Dict[str, str]:
    return {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in PACKAGE.rglob("*.py")
            if not any(home in str(p.relative_to(PACKAGE)) for home in HOMES)}


def test_no_module_defines_a_limit_the_schema_owns_or_another_module_defines():
    findings = scan(package_sources(), schema_limits())
    assert not findings, "limits defined outside their one home:\n" + "\n".join(map(str, findings))


def test_the_schema_limits_are_found():
    keys = {lim.key for lim in schema_limits()}
    assert {"server.limits.max_media_bytes", "server.limits.max_image_pixels", "server.limits.fetch_timeout_s",
            "engine.max_batch_size"} <= keys
    assert "server.port" not in keys and "server.limits" not in keys


LIMITS = [Limit("server.limits.max_media_bytes", "max_media_bytes", 20 * 1024 * 1024),
          Limit("server.limits.max_image_pixels", "max_image_pixels", 64_000_000),
          Limit("server.limits.fetch_timeout_s", "fetch_timeout_s", 30.0)]


def test_the_scanner_names_each_kind_of_second_home():
    """The rule can fail: a copied value, a shadowing name, a limit in two modules, each with file:line."""
    files = {
        "appliance/a.py": ("DEFAULT_MAX_BYTES = 20 * 1024 * 1024\n"
                           "DEFAULT_MAX_IMAGE_PIXELS = 40_000_000\n"
                           "def load(url, *, max_bytes=1 << 20, total_timeout_s=30):\n"
                           "    return urlopen(url, timeout=30)\n"
                           "NODATA_CLASS = 255\n"),
        "appliance/b.py": ("class Policy:\n    connect_timeout_s: float = 5\n"
                           "NODATA_CLASS = 255\n"
                           "CHUNK = 20 * 1024 * 1024  # not a limit-like name\n"
                           "def f(max_tokens=16, port=30): pass\n"),
        # Calls that pass different values under one name use settings; they define none.
        "appliance/c.py": "run(SamplingParams(max_tokens=1))\n",
        "appliance/d.py": "run(SamplingParams(max_tokens=2))\n",
    }
    found = [(f.where, f.name, f.why.split(";")[0]) for f in scan(files, LIMITS)]
    assert found == [
        ("appliance/a.py:1", "DEFAULT_MAX_BYTES", "copies server.limits.max_media_bytes"),
        ("appliance/a.py:2", "DEFAULT_MAX_IMAGE_PIXELS", "shadows server.limits.max_image_pixels (6.4e+07)"),
        ("appliance/a.py:3", "total_timeout_s", "copies server.limits.fetch_timeout_s"),
        ("appliance/a.py:4", "timeout", "copies server.limits.fetch_timeout_s"),
        ("appliance/b.py:3", "NODATA_CLASS", "also defined at appliance/a.py:5"),
    ]
