"""Config options a search exported into the user's folder (pipeline.resources.user_conf, e.g.
method/ptd_tuned.yaml) load by name, ahead of the shipped conf/ options of the same name."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from pipeline.resources import user_conf


class UserConfigSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if user_conf().is_dir():  # nothing exported yet: nothing to search (and no Hydra warning)
            search_path.prepend(provider="specdec-user", path=f"file://{user_conf()}")
