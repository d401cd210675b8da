"""The libraries' versions the project needs beyond what pip enforced at install (an environment where another
package later installed an older transformers, or one installed with --no-deps): checked from the installed
packages' metadata, without importing them."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# the oldest transformers the engine runs on: `cache_utils.get_layer_types_and_kwargs` (5.14) and the sliding
# layers' past recording (`activate_past_recording`, 5.15); 5.0-5.14 fail at import or on the first hybrid model
# (2026-12-07: the engine's tests pass on 5.15.0 and 5.25.0; pyproject.toml pins the same)
MIN_TRANSFORMERS = "5.15"


def old_libraries() -> str | None:
    """One line naming an installed library older than the project needs (None: none is)."""
    from packaging.version import Version

    try:
        installed = version("transformers")
    except PackageNotFoundError:
        return None  # the import that needs it says so
    if Version(installed).release < Version(MIN_TRANSFORMERS).release:
        return (f"transformers {installed} is installed; this project needs transformers>={MIN_TRANSFORMERS}: "
                f"pip install -U 'transformers>={MIN_TRANSFORMERS}'")
    return None
