"""``python -m sim``: the batchsim command line."""

from sim.cli import main

raise SystemExit(main())
