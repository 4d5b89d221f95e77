"""``python -m tickwheel``: the same as the ``tickwheel`` command."""

from ._cli import main

raise SystemExit(main())
