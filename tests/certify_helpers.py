"""What the `crop certify` tests share: an agent file to certify and the check that a refusal is one line."""
from pathlib import Path

import pytest

from crop.__main__ import main

from networks import mlp, sb3_data, sb3_dqn_state, sb3_zip


def cartpole_dqn(path: Path) -> Path:
    """A CartPole DQN as Stable-Baselines3 saves it (MlpPolicy [64, 64])."""
    return sb3_zip(path, sb3_dqn_state(mlp([4, 64, 64, 2], 0), mlp([4, 64, 64, 2], 1)), sb3_data("DQN"))


def refused(argv, capsys) -> str:
    """``crop certify ARGV``'s error: one line on stderr, exit status 2."""
    with pytest.raises(SystemExit) as e:
        main(["certify", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("crop certify: error: "), err
    return err
