"""``python -m fpsim.kernels.validate``: the ``fpsim validate-kernels`` command."""

import sys

from .cli import main

sys.exit(main())
