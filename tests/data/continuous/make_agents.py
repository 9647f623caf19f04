"""Train the two small Stable-Baselines3 agents kept as test fixtures (run by hand, never by the tests):
SAC on Pendulum-v1 and PPO on MountainCarContinuous-v0, each saved as SB3 writes it (``model.save``), with
SB3's own deterministic actions (and SAC's critic values) on fixed observations in ``reference.npz`` for
the import tests to compare with, without SB3 installed.

    pip install stable-baselines3==2.9.2   # not a dependency of crop
    python tests/data/continuous/make_agents.py            # a few CPU-minutes
    pip install 'gymnasium[mujoco]' && python tests/data/continuous/make_agents.py sac_hopper   # one of them

Names given on the command line train only those agents; ``reference.npz`` keeps the others' entries.
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch
from stable_baselines3 import PPO, SAC

HERE = Path(__file__).parent
AGENTS = {
    # SB3 zoo's SAC settings for Pendulum-v1 (learning_rate 1e-3), a smaller network and fewer steps
    "sac_pendulum": (SAC, "Pendulum-v1", 12000,
                     dict(learning_rate=1e-3, policy_kwargs=dict(net_arch=[64, 64]), learning_starts=1000)),
    # SB3 zoo's PPO settings for MountainCarContinuous-v0 without observation normalisation (VecNormalize's
    # statistics are not in the zip, so an agent trained with it cannot be imported faithfully)
    "ppo_mountaincar": (PPO, "MountainCarContinuous-v0", 30000,
                        dict(batch_size=256, n_steps=8, gamma=0.9999, learning_rate=7.77e-05, ent_coef=0.00429,
                             clip_range=0.1, n_epochs=10, gae_lambda=0.9, max_grad_norm=5, vf_coef=0.19,
                             use_sde=True, policy_kwargs=dict(log_std_init=-3.29, ortho_init=False,
                                                              net_arch=[64, 64]))),
    # a tiny SAC on MuJoCo's Hopper-v5 (the `mujoco` extra): a fixture of the clipped-return workflow
    # (tests/configs/mujoco.yaml), not a good hopper; small network and buffer so that the zip stays small
    "sac_hopper": (SAC, "Hopper-v5", 3000,
                   dict(learning_rate=1e-3, buffer_size=3000, learning_starts=500,
                        policy_kwargs=dict(net_arch=[32, 32]))),
}


def main():
    torch.set_num_threads(1)
    names = sys.argv[1:] or list(AGENTS)
    old = HERE / "reference.npz"
    refs = dict(np.load(old)) if old.is_file() else {}
    for name in names:
        cls, env, steps, kw = AGENTS[name]
        t0 = time.time()
        model = cls("MlpPolicy", env, seed=0, device="cpu", **kw)
        model.learn(steps)
        model.save(HERE / f"{name}.zip")
        # within the observation bounds, and within ±5 where they are infinite (MuJoCo's)
        low, high = (np.clip(b, -5.0, 5.0) for b in (model.observation_space.low, model.observation_space.high))
        obs = np.random.default_rng(0).uniform(low, high, size=(64, *model.observation_space.shape)).astype(np.float32)
        refs[f"{name}_obs"] = obs
        refs[f"{name}_action"] = model.predict(obs, deterministic=True)[0]
        if cls is SAC:
            with torch.no_grad():
                x = torch.as_tensor(obs)
                a = model.policy.actor(x, deterministic=True)
                refs[f"{name}_q"] = torch.min(torch.cat(model.policy.critic(x, a), 1), 1).values.numpy()
        print(f"{name}: {steps} steps in {time.time() - t0:.0f} s")
    np.savez(HERE / "reference.npz", **refs)


if __name__ == "__main__":
    main()
