"""The libraries' versions the project needs beyond what pip enforced at install (an environment where another
package later installed an older transformers, or one installed with --no-deps)."""

from __future__ import annotations

import sys

# the oldest transformers the engine runs on: `cache_utils.get_layer_types_and_kwargs` (5.14) and the sliding
# layers' past recording (`activate_past_recording`, 5.15); 5.0-5.14 fail at import or on the first hybrid model
# (2026-12-07: the engine's and methods' tests pass on 5.15.0 and 5.25.0; pyproject.toml pins the same)
MIN_TRANSFORMERS = "5.15"


def old_libraries() -> str | None:
    """One line naming an installed library older than the project needs (None: none is). The version of the
    transformers that `import transformers` loads, not of a package's metadata (an editable or stale install)."""
    from packaging.version import InvalidVersion, Version

    import transformers

    try:
        too_old = Version(transformers.__version__).release < Version(MIN_TRANSFORMERS).release
    except InvalidVersion:  # a local build named otherwise: its imports decide
        return None
    if too_old:
        return (f"transformers {transformers.__version__} is installed; this project needs transformers>="
                f"{MIN_TRANSFORMERS}: pip install -U 'transformers>={MIN_TRANSFORMERS}'")
    return None


def exit_on_old_libraries() -> None:
    """For a command's entry, before it imports the engine: the problem in one line and exit 2."""
    problem = old_libraries()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
