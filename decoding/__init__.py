"""Speculative decoding: the shared engine (`engine/`), one small module per method (`methods/`)
and the drafter and draft-tree building blocks (`drafting/`). A method module defines a config
dataclass (every hyperparameter its paper names, with the paper's default) and a `Method`
subclass; list it here to register it."""

METHOD_MODULES = ("ar", "pld", "sd", "dflash", "ddtree", "caddtree", "domino", "dominotree", "lookahead", "self_draft", "ptd", "spec_cascade", "via_sd", "eagle3")


def method_configs() -> dict:
    """name -> config dataclass of every registered method."""
    import importlib

    configs = {}
    for module_name in METHOD_MODULES:
        module = importlib.import_module(f"decoding.methods.{module_name}")
        config_cls = module.CONFIG
        configs[config_cls.name] = config_cls
    return configs
