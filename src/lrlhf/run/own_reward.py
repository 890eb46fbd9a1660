"""A reward the user wrote into the config, settled before planning: its own calibration, no reward model it does not
use, and a node given anew replacing the old one.

- ``module.reward_model`` set on the command line (not through ``reward=...``, whose configs say all this
  themselves) is the user's reward: unless ``module.calibration`` is set too, it is never calibrated by the
  recipe's reward-model stage's statistics (the toy scale's default) but as its own (a reward-model folder: that
  folder's calibration; anything else: none, its raw scores); a calibration measured on the reference's samples
  (the real scales' ``ReferenceSamples``) is its own already and stays. Unless ``needs.rm`` is set, the RM stage is
  not built when nothing of the run reads it. One line says which.
- An override that gives a node with a ``_target_`` (``++module.reward_model.parts.format.source={_target_: ...}``)
  replaces that node: Hydra merges it into the old one, which keeps the old class's keys (a ``rules`` list passed
  to a function reward); those keys are dropped.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

REWARD_KEY = "module.reward_model"


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _drop_stale_keys(node: DictConfig, value: dict) -> None:
    """Remove from ``node`` (Hydra's merge of ``value`` into an old node) each key ``value`` does not give, down its
    nested dicts; the keys it gives keep Hydra's values (their interpolations unresolved)."""
    for key in [k for k in node.keys() if k not in value]:
        node.pop(key)
    for key, inner in value.items():
        child = node._get_node(key) if key in node else None
        if isinstance(inner, dict) and isinstance(child, DictConfig):
            _drop_stale_keys(child, inner)


def replace_target_nodes(cfg: DictConfig, overrides: list[str]) -> None:
    """Each ``key={_target_: ..., ...}`` override of ``overrides`` leaves at ``key`` exactly the node it gives (the
    old node's other keys dropped)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    candidates = [o for o in overrides if "=" in o and o.split("=", 1)[1].lstrip().startswith("{")
                  and "_target_" in o and not o.startswith("~")]
    if not candidates:
        return
    for override in OverridesParser.create().parse_overrides(candidates):
        value = override.value()
        node = OmegaConf.select(cfg, override.key_or_group, default=None)
        if isinstance(value, dict) and "_target_" in value and isinstance(node, DictConfig):
            with open_dict(cfg):
                _drop_stale_keys(node, value)


def _raw(cfg: DictConfig, key: str, hops: int = 4) -> str:
    """The text ``key`` holds before resolution, following plain ``${a.b}`` interpolations (the recipe's
    ``module.calibration: ${hparams.ppo.calibration}`` to the scale's value); "" when there is no such key."""
    parent, _, leaf = key.rpartition(".")
    container = OmegaConf.select(cfg, parent, default=None) if parent else cfg
    if not isinstance(container, DictConfig) or leaf not in container:
        return ""
    value = container._get_node(leaf)
    text = OmegaConf.to_yaml(value) if isinstance(value, DictConfig) else str(value._value())
    target = text.strip()
    if hops and target.startswith("${") and target.endswith("}") and ":" not in target and target.count("${") == 1:
        return _raw(cfg, target[2:-1], hops - 1)
    return text


def settle_own_reward(cfg: DictConfig, overrides: list[str]) -> str | None:
    """Calibration and ``needs.rm`` for a ``module.reward_model`` given on the command line (module docstring);
    the line to print, or None when the reward is the recipe's (or a ``reward=`` config's)."""
    keys = [_key(o) for o in overrides]
    if OmegaConf.select(cfg, REWARD_KEY, default=None) is None or "reward" in keys or not any(
            k == REWARD_KEY or k.startswith(REWARD_KEY + ".") for k in keys):
        return None
    node = cfg.module._get_node("reward_model")
    written = _raw(cfg, REWARD_KEY)
    folder = None if isinstance(node, DictConfig) else node._value()
    calibration = _raw(cfg, "module.calibration")
    said = []
    if "module.calibration" not in keys and "deps.rm" in calibration:
        with open_dict(cfg):  # the recipe's RM stage's statistics are not this reward's
            cfg.module.calibration = folder  # a folder's own calibration; a program's raw scores
        calibration = str(folder)
        said.append(f"calibrated by its own folder's statistics (module.calibration={folder})" if folder else
                    "its raw scores, uncalibrated (module.calibration=null; set it to calibrate, e.g. "
                    "module.calibration={_target_: lrlhf.rewards.calibration.ReferenceSamples})")
    uses_rm = "deps.rm" in written or "deps.rm" in calibration
    if "needs.rm" not in keys and OmegaConf.select(cfg, "needs.rm", default=None) and not uses_rm:
        with open_dict(cfg):
            cfg.needs.rm = None
        said.append("no reward-model stage built (needs.rm=null)")
    if not said:
        return None
    target = node.get("_target_", "a reward-model folder") if isinstance(node, DictConfig) else "a reward-model folder"
    return f"reward: your module.reward_model ({str(target).rsplit('.', 1)[-1]}): {'; '.join(said)}"


__all__ = ["replace_target_nodes", "settle_own_reward"]
