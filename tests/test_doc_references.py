"""Every file and module the docs and the package's comments name exists.

Read: README.md and docs/*.md whole; under appliance/, the comments and docstrings of the Python modules and
the comments of the C, JavaScript, CSS and HTML files (not those of the vendored libraries). Checked: a
repository path (`appliance/...`, `tests/...`, `conf/...`, `scripts/...`, `benchmarks/...`, `docs/...`,
`helm/...`; `{a,b}` alternatives and `<placeholder>`s allowed) exists, unless it lies in a build output
.gitignore names; a dotted name (`appliance.x.y`, `appliance.x.Name.attr`) is a module and the names it
defines, or a logger's name as the package writes it; `module.Name` is bound by a module of that file name,
else `module` is installed; a bare file name (`kept_connections.py`) is some file's name in the tree, or
another project's file listed in ELSEWHERE."""
import ast
import glob
import importlib.util
import io
import re
import tokenize
from typing import Iterator, List, Tuple

import pytest

from tests.conftest import REPO

TOP = ("appliance", "tests", "conf", "scripts", "benchmarks", "docs", "helm")
# Not preceded by a path or a name (an absolute path such as /opt/appliance/conf, a URL's path).
PATH = re.compile(r"(?<![\w./~-])((?:%s)/(?:[\w.*<>/-]|\{[\w.,-]*\})*)" % "|".join(TOP))
DOTTED = re.compile(r"(?<![\w./-])appliance(?:\.\w+)+")
# `module.Class` (`online_stages.OnlinePipeline`); not `self.`/`cls.` attributes.
MODULE_ATTR = re.compile(r"(?<![\w./-])(?!self\.|cls\.)([a-z_][a-z0-9_]*)\.([A-Z][a-z]\w*)")
BARE = re.compile(r"(?<![\w./{}-])([\w-]+\.(?:py|c|cpp|h|js|css|html|md|yaml|sh))(?![\w/])")
# Files of other projects the text names, with whose they are.
ELSEWHERE = {
    "llama.cpp": "the llama.cpp project",
    "gdal_merge.py": "GDAL's command-line tools",
    "llava.yaml": "the values file docs/deploy.md has the reader write",
    "region.yaml": "the values file docs/geo.md has the reader write",
    "nn.py": "torch (torch.nn: nn.Linear)",
    **{name: "xformers (xformers/ops/fmha/)" for name in (
        "flash.py", "triton_splitk.py", "cutlass.py", "dispatch.py", "common.py", "attn_bias.py", "_cpp_lib.py")},
}
# `// line`, `/* block */` (C, JavaScript, CSS), `<!-- block -->` (HTML).
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|<!--.*?-->", re.S)
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
# Other projects' files, shipped unchanged: their comments name their own sources.
VENDORED = REPO / "appliance" / "serving" / "ui" / "static" / "vendor"


def sources() -> Iterator[Tuple[str, str]]:
    """(repository path, the text of it that is read)."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        yield str(doc.relative_to(REPO)), doc.read_text()
    for path in sorted((REPO / "appliance").rglob("*")):
        if path.is_relative_to(VENDORED):
            continue
        if path.suffix == ".py":
            yield str(path.relative_to(REPO)), python_prose(path.read_text())
        elif path.suffix in (".c", ".h", ".cpp", ".js", ".css", ".html"):
            yield str(path.relative_to(REPO)), "\n".join(COMMENT.findall(path.read_text()))


def python_prose(source: str) -> str:
    """A module's comments and docstrings."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    parts = [token.string for token in tokens if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def tree_names() -> set:
    return {path.name for path in REPO.rglob("*") if not SKIPPED_DIRS & set(path.relative_to(REPO).parts)}


def build_outputs() -> List[str]:
    """The .gitignore entries that are places in the tree (appliance/engine/_kernels/): made by a build."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    return [line.strip("/") for line in lines if "/" in line.strip("/") and not line.startswith("#")]


def logger_names() -> set:
    """String constants of the package that are dotted names under `appliance` (logger names)."""
    found = set()
    for path in (REPO / "appliance").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
                found.add(node.value)
    return found


def alternatives(path: str) -> List[str]:
    """`conf/engine/{default,pool}.yaml` -> both files."""
    braces = re.search(r"\{([^{}]*)\}", path)
    if not braces:
        return [path]
    return [full for choice in braces.group(1).split(",")
            for full in alternatives(path[:braces.start()] + choice + path[braces.end():])]


def path_exists(path: str) -> bool:
    if any(path.startswith(output) for output in build_outputs()):
        return True
    return all(glob.glob(str(REPO / re.sub(r"<[^>]*>", "*", one))) for one in alternatives(path))


def bound_names(statements) -> dict:
    """Name -> the statement that binds it, at one level of a module or class (through if/try blocks)."""
    names = {}
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((target.id, node) for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((alias.asname or alias.name).split(".")[0], node) for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            names.update(bound_names(node.body + node.orelse + getattr(node, "finalbody", [])))
    return names


def dotted_exists(dotted: str) -> bool:
    """The longest prefix that is a module; what follows, names defined in it (then in its classes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            scope = ast.parse(module.read_text()).body
            for name in parts[i:]:
                node = bound_names(scope).get(name)
                if node is None:
                    return False
                scope = node.body if isinstance(node, ast.ClassDef) else []
            return True
    return False


def missing(text: str, names: set, loggers: set) -> List[str]:
    """The references in `text` to nothing in the tree."""
    paths = [m.group(1).rstrip(".,") for m in PATH.finditer(text)]
    gone = [path for path in paths if not path_exists(path)]
    gone += [m.group(0) for m in DOTTED.finditer(text) if m.group(0) not in loggers and not dotted_exists(m.group(0))]
    gone += [m.group(1) for m in BARE.finditer(text) if m.group(1) not in names and m.group(1) not in ELSEWHERE]
    gone += [m.group(0) for m in MODULE_ATTR.finditer(text) if not module_attr_exists(*m.groups())]
    return gone


def module_attr_exists(module: str, name: str) -> bool:
    """A module of the tree named `module` binds `name`; else `module` is installed or another project's."""
    ours = [path for path in REPO.rglob(f"{module}.py") if not SKIPPED_DIRS & set(path.relative_to(REPO).parts)]
    if ours:
        return any(name in bound_names(ast.parse(path.read_text()).body) for path in ours)
    return f"{module}.py" in ELSEWHERE or importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def known():
    return tree_names(), logger_names()


@pytest.mark.parametrize("source, text", list(sources()),
                         ids=lambda value: value if "\n" not in value else "")
def test_every_named_file_and_module_exists(source, text, known):
    assert missing(text, *known) == [], f"{source} names what is not in the tree"


@pytest.mark.parametrize("text, gone", [
    ("see appliance/serving/gone.py, and tests/ui/test_gone.py.",
     ["appliance/serving/gone.py", "tests/ui/test_gone.py"]),
    ("conf/engine/{default,nope}.yaml", ["conf/engine/{default,nope}.yaml"]),
    ("`appliance.serving.gone` and `appliance.fetch.no_such_function`",
     ["appliance.serving.gone", "appliance.fetch.no_such_function"]),
    ("appliance.protocol.pooling.PoolingBody.no_such_field", ["appliance.protocol.pooling.PoolingBody.no_such_field"]),
    ("kept by pool.py and cpu_kernels.c", ["pool.py", "cpu_kernels.c"]),
    ("split.OnlinePipeline and online_stages.OnlinePipelines",
     ["split.OnlinePipeline", "online_stages.OnlinePipelines"]),
    # Each of these exists: a directory, alternatives, a placeholder, a build output, a class's field, a
    # logger, a file named bare, another project's file, a path under a URL.
    ("conf/pipeline/ conf/engine/{default,pool}.yaml tests/fixtures/prithvi_golden_t<frames> "
     "appliance/engine/_kernels/cpu_kernels-<key>.so appliance.protocol.pooling.PoolingBody.model_config "
     "appliance.access kept_connections.py llama.cpp https://example.com/docs/gone.md "
     "online_stages.OnlinePipeline torch.Tensor flash.FwOp cls.Options", []),
])
def test_a_reference_to_nothing_is_found(text, gone, known):
    assert missing(text, *known) == gone
