"""`python -m pipesgd_ref` is the `pipesgd` command."""

from pipesgd_ref.commands.cli import main

raise SystemExit(main())
