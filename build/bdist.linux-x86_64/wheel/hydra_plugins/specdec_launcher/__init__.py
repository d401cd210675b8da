"""Hydra only instantiates launchers defined under the `hydra_plugins` namespace, so the two
launcher classes live here; their logic is in pipeline/launcher.py. Without the `slurm` extra
(hydra-submitit-launcher) there are none, and `hydra/launcher=slurm|local` stops with one line
(pipeline.cli.precheck_overrides)."""

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
except ImportError:
    submitit_launcher = None

if submitit_launcher is not None:
    from pipeline.launcher import RobustWaitMixin

    class SlurmLauncher(RobustWaitMixin, submitit_launcher.SlurmLauncher):
        pass

    class LocalLauncher(RobustWaitMixin, submitit_launcher.LocalLauncher):
        pass
