"""The three packages depend in one direction: server -> (stoppers, reward); nothing back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each package may import beyond the standard library and itself.
FORBIDDEN = {
    "stoppers": {
        "server",
        "reward",
        "fastapi",
        "starlette",
        "uvicorn",
        "httpx",
        "torch",
        "transformers",
        "prometheus_client",
        "pydantic",
    },
    "reward": {"server"},
}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_allowed_layers(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _imported_top_levels(path) & FORBIDDEN[package]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)


def test_stoppers_core_imports_without_optional_dependencies() -> None:
    import subprocess
    import sys

    code = (
        "import sys, stoppers\n"
        "heavy = {'torch', 'transformers', 'fastapi', 'httpx', 'matplotlib'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
