"""``python -m tickwheel.pipeline.stream``: the same as ``tickwheel pipeline stream``."""

from .cli import main

raise SystemExit(main())
