"""The leaseq checkout this command was installed from, for what only a checkout holds.

The handlers ``leaseq drain``, ``reap`` and ``demo`` run are package modules
(``leaseq_lambda.handlers``) and come with any install. ``leaseq lambda serve`` runs
``template.yaml`` and its functions' folders, which only a checkout (or the unpacked
source release) has: without ``--template`` it takes the template of the project folder
pip installed leaseq from (``pip install -e .`` or ``pip install .``), as pip records
it in the distribution's ``direct_url.json`` (PEP 610), else the current directory's.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlsplit


def installed_from() -> Path | None:
    """The local folder pip installed leaseq from, or None (a wheel from an index)."""
    for dist in importlib.metadata.distributions(name="leaseq"):
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        try:
            url = urlsplit(str(json.loads(text).get("url", "")))
        except (ValueError, AttributeError):
            continue
        if url.scheme == "file" and url.path:
            return Path(unquote(url.path))
    return None


def default_template(cwd: Path | None = None, *, project: Path | None = None) -> Path | None:
    """The checkout's ``template.yaml`` (module doc, in order), or None when neither the
    checkout leaseq was installed from nor ``cwd`` (default: the current directory) has
    one. ``project`` defaults to :func:`installed_from`."""
    project = installed_from() if project is None else project
    candidates = [project / "template.yaml"] if project is not None else []
    candidates.append((Path.cwd() if cwd is None else cwd) / "template.yaml")
    return next((path for path in candidates if path.is_file()), None)
