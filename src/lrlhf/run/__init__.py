"""The orchestration floor, and the only package that reads the composed Hydra config: the entry point
(:mod:`~lrlhf.run.cli`), the stage kinds (:mod:`~lrlhf.run.stages`), the one-stage trainer
(:mod:`~lrlhf.run.training`), planning and the stage cache (:mod:`~lrlhf.run.planning`), and the kinds that run
stages of their own: the rounds of iterative RLHF (:mod:`~lrlhf.run.rounds`), the reward-model ensemble
(:mod:`~lrlhf.run.rm_ensemble`) and ``recipe=eval`` (:mod:`~lrlhf.run.evaluate`)."""
