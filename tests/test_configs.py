"""Every shipped config loads into TrainConfig: a typo'd key or a wrong type in configs/ fails here, not in a run."""
import glob
import os

import pytest

from train import load_config

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "*.py")))


def test_the_configs_directory_is_found():
    names = {os.path.basename(path) for path in CONFIGS}
    assert {"demo.py", "gsm8k.py", "smollm2.py"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_config_loads(path):
    cfg = load_config([path])
    assert cfg.out_dir.startswith("out/")  # every run writes under out/, which .gitignore keeps out of the repo


def test_smollm2_config_names_the_installed_gguf_file():
    cfg = load_config([os.path.join(os.path.dirname(CONFIGS[0]), "smollm2.py")])
    assert os.path.isfile(os.path.join(cfg.model, cfg.gguf_file)) and cfg.template == "chat"
