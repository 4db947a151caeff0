"""The README's and docs' commands work as typed: every ``fedsuite ...`` line of their shell examples
is parsed by the CLI's own parser (an unknown command or option, a value of the wrong type or a
missing argument fails here, naming the file and the line), and every relative link points at a
file of the repository. The examples are not run (many take minutes); the parser is what would
refuse them first. And what a reader sees (the pages, the experiment READMEs, the strings of the
tables files, ``fedsuite list``) points at nothing outside the repository: no spec file or item,
no issue number, no remark about which session had a GPU."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("README.md"))]


def shell_commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each ``fedsuite`` command in the page's ```bash blocks, with
    backslash continuations joined and trailing comments dropped."""
    return commands_in(page.read_text())


def commands_in(text: str) -> list[tuple[int, str]]:
    """:func:`shell_commands` of a page's text."""
    out, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() in ("```bash", "```sh", "```console") if not in_block else False
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        pending += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        command, pending = pending, ""
        command = re.sub(r"\s+#.*$", "", command).strip().removesuffix("&").strip()  # a comment; in the background
        if command.startswith("fedsuite "):
            out.append((start, command))
    return out


COMMANDS = [(page, number, command) for page in PAGES for number, command in shell_commands(page)]


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 20 and {p.name for p, _, _ in COMMANDS} >= {"README.md", "sweeps.md", "reproducing.md"}


@pytest.mark.parametrize("page, number, command", COMMANDS,
                         ids=[f"{p.relative_to(ROOT)}:{n}" for p, n, _ in COMMANDS])
def test_every_documented_command_parses(page, number, command, capsys):
    from fedsuite.cli.main import app

    group = typer.main.get_command(app)
    # a shell variable stands for a number the reader fills in (a count the data decides)
    args = [re.sub(r"^\$[A-Z_]+$", "1", a) for a in shlex.split(command)[1:]]
    try:
        # the group's only options (--help, --version) exit: every other command starts with its name
        with group.make_context("fedsuite", list(args), resilient_parsing=False) as ctx:
            name, sub, rest = group.resolve_command(ctx, args)
            with sub.make_context(name, rest, parent=ctx):
                pass
    except (click.exceptions.Exit, SystemExit, click.ClickException) as exc:
        if getattr(exc, "exit_code", getattr(exc, "code", 1)) == 0:  # --help, --version
            return
        pytest.fail(f"{page.relative_to(ROOT)}:{number}: `{command}` does not parse: "
                    f"{capsys.readouterr().err.strip() or exc}")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file(page):
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


# ------------------------------------------------------------------------------------------------
# no pointer to material the reader does not have
# ------------------------------------------------------------------------------------------------
#
# The engineering specs that transcribe each paper, the project's issue tracker and the notes of
# the sessions that wrote the code live outside the repository. What a reader sees (the pages, the
# experiment READMEs, the strings of the tables files that reports print, and what `fedsuite list`
# prints) names the paper's own section, table or equation instead, or states a resolution in place.

#: (pattern, what it points at)
FOREIGN_REFERENCES = [
    (r"\bspecs?/|\bspec \w+\.md|shared/(?:specs|notes)", "a spec or notes file"),
    (r"\bspec A\d|\bspec §|\bspec's\b|\(A\d{1,2}\b|\bA\d{1,2}\)", "a spec item"),
    (r"\[rec\]|\[R\]|\(R\)", "a spec's provenance tag"),
    (r"(?i)\bissues? #?\d", "an issue number"),
    (r"(?i)lent to this task|no GPU (?:was )?lent", "a remark about a session's machines"),
]

TABLES = sorted((ROOT / "experiments").glob("*/tables.toml"))
READ_PAGES = [*PAGES, *sorted((ROOT / "experiments").rglob("README.md")), ROOT / "benchmarks" / "README.md",
              ROOT / "docker" / "README.md"]


def foreign_references(text: str) -> list[str]:
    """``"what: 'the matched text'"`` for each reference in ``text`` to material outside the repository."""
    return [f"{what}: {m.group(0)!r} in {text[max(0, m.start() - 40):m.end() + 40]!r}"
            for pattern, what in FOREIGN_REFERENCES for m in re.finditer(pattern, text)]


def toml_strings(value) -> list[str]:
    """Every string of a parsed TOML document (titles, sources, notes, labels, paper_differences)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in toml_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in toml_strings(v)]
    return []


@pytest.mark.parametrize("text, found", [
    ("see `specs/fedmr.md` §6", 1), ("the spec's Table 3 reading", 1), ("(spec A8)", 1), ("spec §7.13", 1),
    ("(A27: seeds 0..7)", 1), ("issue 14's study", 1), ("Issue 39 (a)", 1), ("[rec]", 1),
    ("no GPU lent to this task", 1), ("(R)'s partition", 1),
    ("the paper's Table 1 (§5.3.1)", 0), ("FedMR's Algorithm 1, line 11", 0), ("an A100 GPU", 0),
    ("one GPU (NVIDIA A100)", 0), ("(A100, 80 GB)", 0),
    ("re-issue the certificate", 0), ("the paper's §7.3", 0),
])
def test_the_reference_patterns(text, found):
    assert len(foreign_references(text)) == found, foreign_references(text)


@pytest.mark.parametrize("page", READ_PAGES, ids=[str(p.relative_to(ROOT)) for p in READ_PAGES])
def test_pages_point_at_nothing_outside_the_repository(page):
    found = foreign_references(page.read_text())
    assert not found, f"{page.relative_to(ROOT)}: " + "; ".join(found)


@pytest.mark.parametrize("path", TABLES, ids=[str(p.relative_to(ROOT)) for p in TABLES])
def test_tables_strings_point_at_nothing_outside_the_repository(path):
    """What reports print from a tables file (title, source, note, labels, the paper differences'
    sources) cites the paper itself; its top-level keys name no spec file."""
    import tomllib

    data = tomllib.loads(path.read_text())
    found = [f for s in toml_strings(data) for f in foreign_references(s)]
    assert "spec" not in data and not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def test_fedsuite_list_points_at_nothing_outside_the_repository():
    """What ``fedsuite list`` prints (methods' summaries, the first docstring line of each dataset,
    partitioner and model), and each method's paper and hyperparameter descriptions."""
    from fedsuite.method import registry
    from fedsuite.cli.show import first_line
    from fedsuite.cli.hyperparams import paper_value

    texts = {}
    for name, method in registry.methods().items():
        texts[f"method {name}"] = " ".join([method.summary, method.paper, *(
            f"{field.description or ''} {paper_value(field)}" for field in method.params.model_fields.values())])
    for kind in ("datasets", "partitioners", "models"):
        for name, fn in getattr(registry, kind)().items():
            texts[f"{kind} {name}"] = first_line(fn.__doc__)
    for name, params in registry.plugins().items():
        texts[f"plug-in {name}"] = " ".join(f"{field.description or ''} {paper_value(field)}"
                                            for field in params.model_fields.values())
    found = [f"{where}: {f}" for where, text in texts.items() for f in foreign_references(text)]
    assert not found, "; ".join(found)


def test_the_methods_parameters_page_is_current():
    """docs/methods/parameters.md is written from the methods' and plug-ins' typed sections
    (``python -m fedsuite.cli.hyperparams``), the source ``fedsuite list strategies`` prints: regenerated
    here, it must equal the page (a parameter added, renamed or given another default changes both)."""
    from fedsuite.cli.hyperparams import markdown

    page = ROOT / "docs" / "methods" / "parameters.md"
    assert page.read_text() == markdown(), ("docs/methods/parameters.md is out of date: "
                                            "python -m fedsuite.cli.hyperparams > docs/methods/parameters.md")
    for key in ("`fedprox.mu`", "`fedsam.rho`", "`relaxed_init.beta`", "`neuron_lr.preset`"):
        assert f"| {key} |" in page.read_text()


def test_the_install_says_how_to_get_pytorchs_cpu_build():
    """pip installs PyTorch's CUDA build (a few GB) on a machine without a GPU unless told otherwise:
    the README's set-up names PyTorch's CPU-only wheel index and the option that adds it, by name
    (no package index's host is written into the project)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Set up")
    setup = readme[start:readme.index("\n## ", start)]  # to the next section
    assert "CPU-only wheel index" in setup and "--extra-index-url" in setup
    assert not re.search(r"https?://|download\.pytorch|whl/cpu", setup)


def own_data_commands() -> list[str]:
    """The commands of docs/datasets.md's "Your own data" section, as a shell reads them."""
    page = ROOT / "docs" / "datasets.md"
    text = page.read_text()
    section = text[text.index("## Your own data"):]
    section = section[:section.index("\n## ", 1)]
    return [command for _, command in commands_in(section)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_a_toml_value_in_a_set_is_quoted_for_the_shell(page):
    """``--set dataset_options={path="/data/mine.npz"}`` unquoted reaches fedsuite as
    ``{path=/data/mine.npz}`` (the shell drops the double quotes), which is no TOML: every ``--set``
    whose value holds braces or double quotes is written in single quotes."""
    bad = re.findall(r"--set (?!')[^\s`]*[{\"][^\s`]*", page.read_text())
    assert not bad, f"{page.relative_to(ROOT)}: unquoted --set values: {bad}"


def test_the_own_data_commands_run_as_typed(tmp_path):
    """docs/datasets.md's own-data commands, run by bash as a reader types them (their ``/data/...``
    paths pointed at data generated here: an .npz of feature vectors and an image folder), on the
    in-process engine for one round. They failed as typed: the shell took the unquoted TOML apart."""
    import os
    import subprocess
    import sys

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mine.npz", x_train=rng.standard_normal((200, 8)).astype(np.float32),
             y_train=rng.integers(0, 3, 200), x_test=rng.standard_normal((40, 8)).astype(np.float32),
             y_test=rng.integers(0, 3, 40))
    for split, per_class in (("train", 40), ("test", 10)):
        for label in ("cat", "dog", "emu"):
            folder = tmp_path / "imgs" / split / label
            folder.mkdir(parents=True)
            for i in range(per_class):  # RGB of two sizes: mode="L", size=28 make them one shape
                Image.fromarray(rng.integers(0, 255, (30 + i % 2, 30, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    commands = own_data_commands()
    assert len(commands) == 2 and {"--dataset npz", "--dataset imagefolder"} <= {
        " ".join(c.split()[2:4]) for c in commands}, commands
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    for command in commands:
        typed = command.replace("/data/mine.npz", str(tmp_path / "mine.npz")).replace("/data/imgs", str(tmp_path / "imgs"))
        proc = subprocess.run(["bash", "-c", f"{typed} --engine inprocess --rounds 1 --output-dir {tmp_path / 'runs'}"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, f"`{command}`: {proc.stderr[-2000:]}"
        assert "done: final accuracy" in proc.stdout, proc.stdout[-2000:]
