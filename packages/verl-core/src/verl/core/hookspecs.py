"""Hooks a plugin may implement (with ``@verl.core.plugins.hookimpl``).

Most plugins only need their import side effects (decorators that register platforms and engines);
these hooks are for plugins that want to contribute more.
"""

import pluggy

hookspec = pluggy.HookspecMarker("verl")


@hookspec
def verl_plugin_info() -> dict:
    """Describe the plugin for ``python -m verl.core``: e.g. ``{"version": "1.2", "homepage": "..."}``."""
