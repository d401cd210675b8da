"""Hydra only instantiates launchers defined under the `hydra_plugins` namespace, so the two
launcher classes live here; their logic is in pipeline/launcher.py."""

from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from pipeline.launcher import RobustWaitMixin


class SlurmLauncher(RobustWaitMixin, submitit_launcher.SlurmLauncher):
    pass


class LocalLauncher(RobustWaitMixin, submitit_launcher.LocalLauncher):
    pass
